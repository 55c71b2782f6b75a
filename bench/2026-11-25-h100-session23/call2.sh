#!/bin/bash
# Session 23, call 2: the prepare's masked stores on one decay path per call and its fused l2
# norm with one root and division per batch (kernel log row 41; .carry/deltakv and the test
# executables built from 38e0a68, call 1 plus the K = 256 staging fix): the prefill suites (default, checkpoints, streams, lockstep,
# the mma.sync fallback with DELTAKV_CUDA_ARCH=sm_90), compute-sanitizer, then `bench gdn`
# against main d9d90c0's binary (.carry/deltakv-base) in the same call, twice each.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
b warm deltakv
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1), worst final $(grep -ho 'final_state [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $2}' | sort -g | tail -n 1) ($SECONDS s)"
for mode in "DELTAKV_PREFILL_STATE=lockstep" "DELTAKV_CUDA_ARCH=sm_90"; do
  env $mode timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-$mode.log" 2>&1
  say "$mode suite exit $?: $(grep 'test result' "$logs/t-$mode.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-$mode.log" | awk '{print $3}' | sort -g | tail -n 1) $(grep -h 'panicked' "$logs/t-$mode.log" | head -2 | cut -c1-300)"
done
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log") ($SECONDS s)"
done
b base1 deltakv-base; b new1 deltakv; b base2 deltakv-base; b new2 deltakv
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
