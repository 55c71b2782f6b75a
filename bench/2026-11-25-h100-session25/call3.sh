#!/bin/bash
# Session 25, call 3: (1) row 50, T's halves built over the lower blocks only (.carry/deltakv and
# the test executables, working tree of the session's commit), against row 48's binary
# (.carry/deltakv-r48, 6ef7dab): the prefill suite, memcheck over gate_extremes, `bench gdn`
# twice each, ncu's prepare durations; (2) FLA 0.6 beside row 48's binary (the kept kernels)
# in the same call (tools/compare_fla_prefill.py, speed only).
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
b warm deltakv
timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-gdn_prefill.log" 2>&1
say "gdn_prefill exit $?: $(grep 'test result' "$logs/t-gdn_prefill.log") $(grep -h 'panicked' "$logs/t-gdn_prefill.log" | head -3 | cut -c1-300)"
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1), worst final $(grep -ho 'final_state [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $2}' | sort -g | tail -n 1) ($SECONDS s)"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/memcheck.log" 2>&1
say "memcheck gate_extremes exit $?: $(grep SUMMARY "$logs/memcheck.log") ($SECONDS s)"
b r48_1 deltakv-r48; b new1 deltakv; b r48_2 deltakv-r48; b new2 deltakv
for bin in deltakv-r48 deltakv; do
  timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill_prepare -c 2 --metrics gpu__time_duration.sum .carry/$bin bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/ncu-$bin.txt" 2>&1
  say "ncu $bin exit $?: $(grep -E '^  gdn|duration' "$logs/ncu-$bin.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s %s; ", name, $(NF-1), $NF}') ($SECONDS s)"
done
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl > "$logs/pip.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 300 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
  --deltakv-json "$logs/r48_2.json" --deltakv-bin .carry/deltakv-r48 --csv "$out/prefill-vs-fla.csv" --plot "$out/prefill-vs-fla.png" > "$logs/fla-speed.txt" 2>&1
say "FLA speed exit $? ($SECONDS s):"; tail -8 "$logs/fla-speed.txt" >> "$sum"
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
