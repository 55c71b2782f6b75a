#!/bin/bash
# Session 19, call 1: the overlapped pass with the stage copies on the output group (A: copy
# loops, B: team copies) against the session-18 binary (base), same call.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$out/a-t-gdn_prefill.log" 2>&1
echo "A suite exit $?: $(grep 'test result' "$out/a-t-gdn_prefill.log")"
echo "A worst o: $(grep -ho ': o [0-9.e+-]*' "$out/a-t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$out/a-memcheck.log" 2>&1
echo "A memcheck exit $?: $(grep SUMMARY "$out/a-memcheck.log")"
for round in 1 2; do
  for v in base a b; do
    timeout 60 .carry/deltakv-$v bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$out/bench-$v-$round.txt" 2>&1
    echo "$v/$round: $(grep -h 'B=' "$out/bench-$v-$round.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
  done
done
for v in a b; do
  for share in off 0.85; do
    DELTAKV_PREFILL_RELAY=$share timeout 60 .carry/deltakv-$v bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$out/bench-$v-relay-$share.txt" 2>&1
    echo "$v relay $share: $(grep -h 'qwen3-next' "$out/bench-$v-relay-$share.txt" | awk '{print $2,$3,$6}' | tr '\n' ';')"
  done
done
for v in base a b; do
  timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 12 --metrics gpu__time_duration.sum .carry/deltakv-$v bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$out/ncu-$v.txt" 2>&1
  echo "$v ncu: $(grep -E '^  gdn|duration' "$out/ncu-$v.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s; ", name, $NF}')"
done
