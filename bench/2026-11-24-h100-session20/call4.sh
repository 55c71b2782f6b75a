#!/bin/bash
# Session 20, call 4: the commit with the prepare's FragmentDecays (9c9d4f9, .carry/deltakv):
# the prefill suites (also lockstep), compute-sanitizer (also over the lockstep pass), bench
# against the session's start (base) and with the lockstep pass, FLA 0.6 beside it (speed,
# then accuracy as time allows), the loaded kernels' local memory last.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)"
DELTAKV_PREFILL_STATE=lockstep timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-lockstep.log" 2>&1
say "lockstep suite exit $?: $(grep 'test result' "$logs/t-lockstep.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-lockstep.log" | awk '{print $3}' | sort -g | tail -n 1)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log")"
done
DELTAKV_PREFILL_STATE=lockstep timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/memcheck-lockstep.log" 2>&1
say "memcheck gate_extremes (lockstep) exit $?: $(grep SUMMARY "$logs/memcheck-lockstep.log")"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 90 .carry/$bin bench gdn --device cuda --seq-lens "${SEQ:-1024}" --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base1 deltakv-base; b new1 deltakv
b base-lockstep deltakv-base DELTAKV_PREFILL_STATE=lockstep; b new-lockstep deltakv DELTAKV_PREFILL_STATE=lockstep
b base2 deltakv-base
SEQ=1024,4096,16384,65536 b new2 deltakv
if python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null; then
  PYTHONPATH=/tmp/fla-site timeout $((500 - SECONDS)) python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json "$logs/new2.json" --deltakv-bin .carry/deltakv --csv "$out/prefill-vs-fla.csv" \
    --plot "$out/prefill-vs-fla.png" > "$logs/fla-speed.txt" 2>&1
  say "FLA speed exit $?:"; tail -20 "$logs/fla-speed.txt" >> "$sum"
  if [ "$SECONDS" -lt 400 ]; then
    PYTHONPATH=/tmp/fla-site timeout $((540 - SECONDS)) python3 -u tools/compare_fla_prefill.py --skip-speed \
      --deltakv-json "$logs/new2.json" --deltakv-bin .carry/deltakv > "$logs/fla-accuracy.txt" 2>&1
    say "FLA accuracy exit $?:"; tail -12 "$logs/fla-accuracy.txt" >> "$sum"
  else say "FLA accuracy: skipped (time)"; fi
fi
if [ "$SECONDS" -lt 520 ]; then
  timeout $((580 - SECONDS)) .carry/tests/deltakv-cuda-kernels_compile --test-threads=1 --nocapture every_loaded_kernel > "$logs/local-memory.log" 2>&1
  say "loaded kernels' local memory exit $?: $(grep -h 'none uses local memory\|panicked' "$logs/local-memory.log" | head -2)"
fi
tar -czf "$out/logs.tar.gz" -C "$logs" .
