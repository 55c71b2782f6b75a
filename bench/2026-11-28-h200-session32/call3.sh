#!/usr/bin/env bash
# Session 32, call 3 (H200, right after call 2 on the warm machine): FlashInfer 0.7.2's payload
# part 2 (.fi/2) joined to call 2's part 1, then `bench gdn --device cuda` (serving shapes) beside
# FLA 0.6 and FlashInfer 0.7.2 (tools/compare_fla_prefill.py --flashinfer: CUDA graphs on all
# sides), then the accuracy part (deltakv and FLA against an f64 recurrence; drift 4k -> 128k).
# Then the CLI's device tests (`kv`, `gdn`, `gdn-decode` on cuda and wgpu against cpu: the
# `kv --device` facade's host scan of ec5f66c) and the wgpu KV suite through NVIDIA's Vulkan
# driver set up by tools/vulkan-env.sh (8cf2fa0).
# Carries .fi/2, .carry/s32b, .carry/vulkan (.carry/deltakv and .whl left there by call 2).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
cp .fi/2/* /tmp/fi/ && mkdir -p /tmp/site && cat /tmp/fi/part.* | xz -d -T8 | tar -C /tmp/site -xf -
echo "payload rc $? at ${SECONDS}s"; ls /tmp/site | head -n 20
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/fla-site
[ -d /tmp/fla-site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
.carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
    --json /tmp/deltakv-prefill.json >"$out/bench-cuda.txt" 2>&1
timeout 300 python3 tools/compare_fla_prefill.py --skip-accuracy --flashinfer \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv \
    --csv "$out/prefill-vs-peers.csv" >"$out/compare-peers.txt" 2>&1
tail -n 14 "$out/compare-peers.txt"
echo "speed done at ${SECONDS}s"
timeout 200 python3 tools/compare_fla_prefill.py --skip-speed --deltakv-json /tmp/deltakv-prefill.json \
    --deltakv-bin .carry/deltakv >"$out/accuracy.txt" 2>&1
cat "$out/accuracy.txt" | tail -n 12
echo "accuracy done at ${SECONDS}s"
. tools/vulkan-env.sh
for t in .carry/s32b/*; do
    name=$(basename "$t")
    CI=true DELTAKV_BIN="$PWD/.carry/deltakv" timeout 120 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    echo "== $name" >>"$out/tests.txt"; cat "/tmp/$name.log" >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
echo "done at ${SECONDS}s"
