#!/usr/bin/env bash
# Session 32, call 1 (H200): where the CUDA prefill's time goes on this GPU, beside FLA's split:
# `bench gdn --device cuda` (serving shapes) under nsys (the timeline with both relay streams, per-kernel start and end), ncu's
# per-kernel durations for the serving shapes' first call, FLA's per-kernel split
# (tools/profile_fla_prefill.py).
# Carries .carry/deltakv, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
command -v nsys ncu | tee -a "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
if command -v nsys >/dev/null; then
    timeout 150 nsys profile --cuda-graph-trace=node --sample=none --cpuctxsw=none -o /tmp/dk \
        .carry/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 >"$out/nsys-bench.txt" 2>&1
    timeout 120 nsys stats --report cuda_gpu_trace --format csv -o /tmp/dk /tmp/dk.nsys-rep >/dev/null 2>&1
    ls /tmp/dk* | tee -a "$out/gpu.txt"
    gzip -c /tmp/dk_cuda_gpu_trace.csv >"$out/dk-gpu-trace.csv.gz" 2>/dev/null
fi
echo "nsys done at ${SECONDS}s"
timeout 150 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 12 \
    --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 1024 \
    --decode-batches 1 >"$out/ncu.txt" 2>&1
grep -E 'gdn_prefill|gpu__time' "$out/ncu.txt" | head -n 30
echo "ncu done at ${SECONDS}s"
PYTHONPATH=/tmp/fla-site timeout 120 python3 tools/profile_fla_prefill.py \
    --shapes 1:16384:16:32,1:65536:2:8,8:8192:16:32,1:4096:16:32 >"$out/fla-split.txt" 2>&1
tail -n 40 "$out/fla-split.txt"
echo "done at ${SECONDS}s"
