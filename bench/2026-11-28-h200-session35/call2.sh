#!/usr/bin/env bash
# Session 35, call 2: d11869c (the register walks' prepare without v, W or U) beside FLA 0.6 in
# the same call: `bench gdn` at T 1024 / 4096 / 16384 / 65536 and the four serving shapes,
# then tools/compare_fla_prefill.py's speed part (CUDA graphs on both sides); then ncu's full
# set over one launch of the new prepare at T 16384 (details page, source hot spots).
# Carries .carry/deltakv, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
.carry/deltakv bench gdn --device cuda --seq-lens 1024,4096,16384,65536 --decode-batches 1 \
    --json /tmp/deltakv-prefill.json >"$out/bench-cuda.txt" 2>&1
grep -E 'T=[0-9]+ ' "$out/bench-cuda.txt"
echo "bench done at ${SECONDS}s"
PYTHONPATH=/tmp/fla-site timeout 300 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv \
    --csv /tmp/prefill-vs-fla.csv >/tmp/compare-fla.txt 2>&1
cp /tmp/compare-fla.txt /tmp/prefill-vs-fla.csv "$out/" 2>/dev/null
tail -n 14 "$out/compare-fla.txt"
echo "fla done at ${SECONDS}s"
timeout 120 ncu --set full --import-source no -k regex:gdn_prefill_prepare -c 1 \
    .carry/deltakv bench gdn --device cuda --serving t16384 --seq-lens 64 --decode-batches 1 \
    >/tmp/ncu-prepare.txt 2>&1
cp /tmp/ncu-prepare.txt "$out/ncu-prepare.txt"
grep -E 'Duration|Throughput|Issue Slots|Eligible|Active Warps|Registers|Stall|Warp Cycles|Achieved' \
    "$out/ncu-prepare.txt" | head -40
echo "done at ${SECONDS}s"
