#!/bin/bash
# Session 25, call 4 (kernel log row 51; .carry/deltakv and the test executables built from the
# working tree named in the session's commit): the walk after the prepare as its programmatic dependent.
# The prefill suites (default, checkpoints, streams, lockstep,
# the sm_90 mma.sync fallback), compute-sanitizer, `bench gdn` against row 48's binary
# (.carry/deltakv-r48, 6ef7dab) in the same call, three times each.
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
b r48_1 deltakv-r48; b new1 deltakv; b r48_2 deltakv-r48; b new2 deltakv
b r48_3 deltakv-r48; b new3 deltakv
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
