#!/usr/bin/env bash
# Session 36, call 5 (H200, right after call 4 on the warm machine): FlashInfer 0.7.2's payload
# part 2 joined to call 4's part 1, then `bench gdn --device cuda` (serving shapes) beside FLA 0.6
# and FlashInfer 0.7.2.post1 (tools/compare_fla_prefill.py --flashinfer: CUDA graphs for all
# three), main 9ebf953's build.
# Carries .fi/2, .carry/s36a (call 4's build) and .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
[ -f /tmp/fi/part.aa ] || { echo "part 1 is gone: the machine was not kept warm"; exit 1; }
cp .fi/2/* /tmp/fi/ && mkdir -p /tmp/site && cat /tmp/fi/part.* | xz -d -T8 | tar -C /tmp/site -xf -
echo "payload rc $? at ${SECONDS}s"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/fla-site
.carry/s36a/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 \
    --json /tmp/dk.json >"$out/bench-cuda.txt" 2>&1
echo "bench done at ${SECONDS}s"
timeout "${1:-300}" python3 -u tools/compare_fla_prefill.py --skip-accuracy --flashinfer \
    --deltakv-json /tmp/dk.json --deltakv-bin .carry/s36a/deltakv \
    --csv "$out/prefill-vs-peers.csv" >"$out/compare-peers.txt" 2>&1
grep -v INFO "$out/compare-peers.txt" | tail -n 10
echo "done at ${SECONDS}s"
