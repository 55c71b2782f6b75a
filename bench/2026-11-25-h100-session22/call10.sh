#!/bin/bash
# Session 22, call 10: short prompts walked whole where the relay would run (plan rule
# RELAY_MIN_CHUNKS = 40, from call 9; kernels unchanged; .carry/deltakv and the test
# executables built from the working tree): the prefill suites, then `bench gdn` at the
# serving shapes and T 1024-3072 against call 7's binary (.carry/deltakv-base) in the same call.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024,2048,2560,3072 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6,$7,$10}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
b warm deltakv
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1) ($SECONDS s)"
b base deltakv-base; b new deltakv
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
