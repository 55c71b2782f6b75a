#!/bin/bash
# Session 19, call 4: g = the overlapped pass on wgmma (OV_BATCH 8) and the walks' grid as
# (tile, head, segment), against o8 (call 3's binary: wgmma without the grid change) and base.
# Writes $OUT/summary.txt as it goes and the logs as one tarball.
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
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log")"
done
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 60 .carry/$bin bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base1 deltakv-base; b o8-1 deltakv-o8; b g1 deltakv-g
b base2 deltakv-base; b o8-2 deltakv-o8; b g2 deltakv-g
for share in 0.7 0.8; do b g-share$share deltakv-g DELTAKV_PREFILL_RELAY=$share; done
timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum .carry/deltakv-g bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/ncu-g.txt" 2>&1
say "g ncu: $(grep -E '^  gdn|duration' "$logs/ncu-g.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s; ", name, $NF}')"
tar -czf "$out/logs.tar.gz" -C "$logs" .
