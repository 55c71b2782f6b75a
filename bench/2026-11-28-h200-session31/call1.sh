#!/usr/bin/env bash
# Session 31, call 1: main (ce9389e) on the H200, the first run of deltakv on this chip. The
# CUDA half of the GPU check without the sanitizers (`tools/gpu-check.sh run quick`: the CUDA
# tests, the demo, `bench gdn --device cuda`, FLA's decode and prefill beside it with the
# prefill's accuracy), then the compressed KV (`run-kv quick`: the KV tests, `bench kv`, torch
# SDPA beside it). Carries .carry and .whl (`tools/gpu-check.sh build`). Everything each mode
# wrote is packed in $OUT/call1.tar.gz; the two summaries and comparisons are copied beside it.
set -u
out=${OUT:-gpu-check-out}
work=$(mktemp -d)
mkdir -p "$work/run" "$work/kv" "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$out/gpu.txt"
OUT=$work/run timeout 400 bash tools/gpu-check.sh run quick >"$work/run/stdout.txt" 2>&1
echo "run quick exit $? at ${SECONDS}s"
OUT=$work/kv timeout $((560 - SECONDS)) bash tools/gpu-check.sh run-kv quick >"$work/kv/stdout.txt" 2>&1
echo "run-kv quick exit $? at ${SECONDS}s"
cat "$work/run/summary.txt" "$work/kv/summary.txt" >"$out/summary.txt" 2>/dev/null
cat "$work/run/compare.txt" >"$out/compare-fla.txt" 2>/dev/null
cat "$work/kv/compare-kv.txt" >"$out/compare-kv.txt" 2>/dev/null
tar -czf "$out/call1.tar.gz" -C "$work" run kv
cat "$out/summary.txt"
tail -n 40 "$out/compare-fla.txt"
tail -n 12 "$out/compare-kv.txt"
