#!/bin/bash
# Session 19, call 3: the overlapped pass on wgmma too (o8: A batches of 8 k steps, o4: of 4) against w (call 2) and base.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t=.carry/tests/deltakv-cuda-gdn_prefill
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$out/t-$suite.log" 2>&1
  echo "$suite exit $?: $(grep 'test result' "$out/t-$suite.log") $(grep -h 'panicked' "$out/t-$suite.log" | head -3)"
done
echo "worst o: $(grep -ho ': o [0-9.e+-]*' "$out/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)"
DELTAKV_PREFILL_STATE=lockstep timeout 150 $t --test-threads=1 --nocapture > "$out/t-lockstep.log" 2>&1
echo "lockstep suite exit $?: $(grep 'test result' "$out/t-lockstep.log") $(grep -h 'panicked' "$out/t-lockstep.log" | head -3)"
echo "lockstep worst o: $(grep -ho ': o [0-9.e+-]*' "$out/t-lockstep.log" | awk '{print $3}' | sort -g | tail -n 1)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $t --test-threads=1 gate_extremes > "$out/$tool.log" 2>&1
  echo "$tool gate_extremes exit $?: $(grep SUMMARY "$out/$tool.log")"
done
b() { # name, binary, env...
  local name=$1 bin=$2; shift 2
  env "$@" timeout 60 .carry/$bin bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$out/bench-$name.txt" 2>&1
  echo "$name: $(grep -h 'B=' "$out/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base1 deltakv-base; b w1 deltakv-w; b o8-1 deltakv-o8; b o4-1 deltakv-o4
b base2 deltakv-base; b w2 deltakv-w; b o8-2 deltakv-o8; b o4-2 deltakv-o4
for share in 0.65 0.7 0.8; do b o8-share$share deltakv-o8 DELTAKV_PREFILL_RELAY=$share; done
b o8-relayoff deltakv-o8 DELTAKV_PREFILL_RELAY=off
for v in w o8; do
  timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum .carry/deltakv-$v bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$out/ncu-$v.txt" 2>&1
  echo "$v ncu: $(grep -E '^  gdn|duration' "$out/ncu-$v.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s; ", name, $NF}')"
done
