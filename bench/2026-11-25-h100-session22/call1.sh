#!/bin/bash
# Session 22, call 1: the walks as the prepare's programmatic dependents (kernel log row 37;
# .carry/deltakv and the test executables built from the working tree): the prefill suites
# (default, lockstep),
# compute-sanitizer, `bench gdn` against main's binary (.carry/deltakv-base, f6a8651's kernels)
# and DELTAKV_PREFILL_EARLY=off in the same call, then FLA 0.6.
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
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1) ($SECONDS s)"
b base1 deltakv-base; b new1 deltakv; b off1 deltakv DELTAKV_PREFILL_EARLY=off
b base2 deltakv-base; b new2 deltakv; b off2 deltakv DELTAKV_PREFILL_EARLY=off
for mode in "DELTAKV_PREFILL_STATE=lockstep"; do
  env $mode timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-$mode.log" 2>&1
  say "$mode suite exit $?: $(grep 'test result' "$logs/t-$mode.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-$mode.log" | awk '{print $3}' | sort -g | tail -n 1) $(grep -h 'panicked' "$logs/t-$mode.log" | head -2 | cut -c1-300)"
done
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log") ($SECONDS s)"
done
if [ "$SECONDS" -lt 400 ] && python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl > "$logs/pip.txt" 2>&1; then
  PYTHONPATH=/tmp/fla-site timeout $((575 - SECONDS)) python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json "$logs/new2.json" --deltakv-bin .carry/deltakv --csv "$out/prefill-vs-fla.csv" --plot "$out/prefill-vs-fla.png" > "$logs/fla-speed.txt" 2>&1
  say "FLA speed exit $? ($SECONDS s):"; tail -8 "$logs/fla-speed.txt" >> "$sum"
else say "FLA speed: skipped ($SECONDS s)"; fi
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
