#!/bin/bash
# Session 21, call 4: W, U and the scores dense and swizzled, one bulk copy each (kernel log row 35; .carry/deltakv
# and the test executables built from the working tree): the prefill suites (default, lockstep,
# and the mma.sync fallback with DELTAKV_CUDA_ARCH=sm_90), compute-sanitizer, `bench gdn` against
# 4c0b63f's binary (.carry/deltakv-base) in the same call, ncu's kernel durations at T 16384.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)"
for mode in "DELTAKV_PREFILL_STATE=lockstep" "DELTAKV_CUDA_ARCH=sm_90"; do
  env $mode timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-$mode.log" 2>&1
  say "$mode suite exit $?: $(grep 'test result' "$logs/t-$mode.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-$mode.log" | awk '{print $3}' | sort -g | tail -n 1) $(grep -h 'panicked' "$logs/t-$mode.log" | head -2 | cut -c1-300)"
done
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log")"
done
DELTAKV_PREFILL_STATE=lockstep timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/memcheck-lockstep.log" 2>&1
say "memcheck gate_extremes (lockstep) exit $?: $(grep SUMMARY "$logs/memcheck-lockstep.log") ($SECONDS s)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 90 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base1 deltakv-base; b new1 deltakv; b base2 deltakv-base; b new2 deltakv
b new-relay70 deltakv DELTAKV_PREFILL_RELAY=0.7; b new-relay65 deltakv DELTAKV_PREFILL_RELAY=0.65
if [ "$SECONDS" -lt 470 ]; then
  timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 12 --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/ncu.txt" 2>&1
  say "ncu exit $?: $(grep -E '^  gdn|duration' "$logs/ncu.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s; ", name, $NF}')"
fi
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
