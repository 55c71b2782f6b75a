#!/bin/bash
# Session 19, call 5: l = the lockstep walks' W fragments by ldmatrix (on top of g, 8aafba2):
# the suites, sanitizers and local memory on l's kernels; bench base / g / l in the same call;
# FLA 0.6 beside l's bench (speed, then accuracy as time allows).
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
timeout 60 .carry/tests/deltakv-cuda-kernels_compile --test-threads=1 --nocapture every_loaded_kernel > "$logs/local-memory.log" 2>&1
say "loaded kernels' local memory exit $?: $(grep -h 'none uses local memory\|panicked' "$logs/local-memory.log" | head -2)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 90 .carry/$bin bench gdn --device cuda --seq-lens "${SEQ:-16384}" --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base1 deltakv-base; b g1 deltakv-g; b l1 deltakv-l
b base2 deltakv-base; b g2 deltakv-g
SEQ=1024,4096,16384,65536 b l2 deltakv-l
if python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null; then
  PYTHONPATH=/tmp/fla-site timeout $((540 - SECONDS)) python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json "$logs/l2.json" --deltakv-bin .carry/deltakv-l --csv "$out/prefill-vs-fla.csv" \
    --plot "$out/prefill-vs-fla.png" > "$logs/fla-speed.txt" 2>&1
  say "FLA speed exit $?:"; cat "$logs/fla-speed.txt" | tail -20 >> "$sum"
  if [ "$SECONDS" -lt 420 ]; then
    PYTHONPATH=/tmp/fla-site timeout $((550 - SECONDS)) python3 -u tools/compare_fla_prefill.py --skip-speed \
      --deltakv-json "$logs/l2.json" --deltakv-bin .carry/deltakv-l > "$logs/fla-accuracy.txt" 2>&1
    say "FLA accuracy exit $?:"; tail -12 "$logs/fla-accuracy.txt" >> "$sum"
  else say "FLA accuracy: skipped (time)"; fi
fi
tar -czf "$out/logs.tar.gz" -C "$logs" .
