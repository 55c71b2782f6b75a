#!/usr/bin/env bash
# Session 27, call 11: the submitted code (after the review's mends, SASS unchanged from call 9's
# build) through `tools/gpu-check.sh kv-encode` (the CUDA KV suite in both encode forms, the three
# sanitizers over the encode tests, the encode beside the eight-lane kernel), then the attention
# beside torch SDPA. Carry: .carry/deltakv, .carry/tests.
set -u
out=${OUT:-gpu-check-out}
OUT=$out tools/gpu-check.sh kv-encode > /dev/null 2>&1
logs=$(mktemp -d)
.carry/deltakv bench kv --device cuda --batch 8 --contexts 32768 --json "$logs/bench-kv-b8.json" > "$logs/b8.txt" 2>&1
.carry/deltakv bench kv --device cuda --batch 1 --contexts 131072 --json "$logs/bench-kv-b1.json" > "$logs/b1.txt" 2>&1
python3 tools/compare_sdpa.py --deltakv .carry/deltakv --json-dir "$logs" --csv "$out/kv-vs-sdpa.csv" > "$out/compare-kv.txt" 2>&1
echo "compare_sdpa exit $?: $(tail -n 6 "$out/compare-kv.txt" | tr -s ' ' | tr '\n' ';')" >> "$out/summary.txt"
