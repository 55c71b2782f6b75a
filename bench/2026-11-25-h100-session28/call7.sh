#!/bin/bash
# Session 28, call 7: the submitted code (KV row 39; host launches in kv/encode.rs), built by
# `tools/gpu-check.sh build-prefill`, with the session's starting build (1d5ff6d) as
# .carry/deltakv-base: `tools/gpu-check.sh kv-encode` (the KV suite in both encode forms,
# sanitizers over the encode tests, the encode timed beside the eight-lane form and the base,
# ncu's stall reasons), then the attention beside torch SDPA (`bench kv` at B 8 x 32k and
# B 1 x 128k, tools/compare_sdpa.py), the demo, the kernel compile test on the device and the
# prefill suite.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
OUT=$out/kv-encode bash tools/gpu-check.sh kv-encode > /dev/null 2>&1
logs=$(mktemp -d); sum=$out/summary.txt
cat "$out/kv-encode/summary.txt" > "$sum"
say() { echo "$*" >> "$sum"; }
{ .carry/deltakv bench kv --device cuda --batch 8 --contexts 32768 --json "$logs/bench-kv-b8.json" &&
  .carry/deltakv bench kv --device cuda --batch 1 --contexts 131072 --json "$logs/bench-kv-b1.json"; } > "$logs/bench-kv.txt" 2>&1
say "bench kv exit $?: $(grep -h 'decode\|encode' "$logs/bench-kv.txt" | tr -s ' ' | tr '\n' ';')"
python3 tools/compare_sdpa.py --deltakv .carry/deltakv --json-dir "$logs" --csv "$out/kv-vs-sdpa.csv" > "$logs/compare-kv.txt" 2>&1
say "compare_sdpa exit $?: $(tail -n 12 "$logs/compare-kv.txt" | tr -s ' ' | tr '\n' ';')"
.carry/deltakv demo --tokens 1024 > "$logs/demo.txt" 2>&1
say "demo exit $?: $(grep -h 'compressed KV' "$logs/demo.txt" | tr -s ' ' | tr '\n' ';')"
.carry/tests/deltakv-cuda-kernels_compile --test-threads=1 --nocapture > "$logs/kernels-compile.log" 2>&1
say "kernels_compile exit $?: $(grep 'test result' "$logs/kernels-compile.log") $(grep -h 'panicked' "$logs/kernels-compile.log" | head -2)"
.carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/prefill.log" 2>&1
say "gdn_prefill exit $?: $(grep 'test result' "$logs/prefill.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/prefill.log" | awk '{print $3}' | sort -g | tail -n 1) ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
