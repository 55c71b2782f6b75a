#!/bin/bash
# Session 19, call 6: the submitted commit's binaries (f): the prefill suites (also with the
# lockstep pass and with DELTAKV_PREFILL_PREPARE_GROUP=1), compute-sanitizer, local memory;
# the suite on plain sm_90 (the walks on mma.sync); bench f against base (f7b6137) and g
# (8aafba2); the prepare group knob, a relay share and sm_90 beside.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)"
DELTAKV_PREFILL_STATE=lockstep timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 > "$logs/t-lockstep.log" 2>&1
say "lockstep suite exit $?: $(grep 'test result' "$logs/t-lockstep.log")"
DELTAKV_PREFILL_PREPARE_GROUP=1 timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-group1.log" 2>&1
say "PREPARE_GROUP=1 suite exit $?: $(grep 'test result' "$logs/t-group1.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-group1.log" | awk '{print $3}' | sort -g | tail -n 1)"
DELTAKV_CUDA_ARCH=sm_90 timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-sm90.log" 2>&1
say "sm_90 (mma.sync walks) suite exit $?: $(grep 'test result' "$logs/t-sm90.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-sm90.log" | awk '{print $3}' | sort -g | tail -n 1)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log")"
done
timeout 60 .carry/tests/deltakv-cuda-kernels_compile --test-threads=1 --nocapture every_loaded_kernel > "$logs/local-memory.log" 2>&1
say "loaded kernels' local memory exit $?: $(grep -h 'none uses local memory\|panicked' "$logs/local-memory.log" | head -2)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 90 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base deltakv-base; b g deltakv-g; b f1 deltakv-f; b f-group1 deltakv-f DELTAKV_PREFILL_PREPARE_GROUP=1
b f2 deltakv-f; b f-group1-2 deltakv-f DELTAKV_PREFILL_PREPARE_GROUP=1
b f-relay0.6 deltakv-f DELTAKV_PREFILL_RELAY=0.6; b f-sm90 deltakv-f DELTAKV_CUDA_ARCH=sm_90
tar -czf "$out/logs.tar.gz" -C "$logs" .
