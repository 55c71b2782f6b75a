#!/usr/bin/env bash
# Session 38, call 7 (H200): the final head's build (.carry/s38f/deltakv, a036ea5) on issue 13's
# bars, wgpu through NVIDIA's Vulkan driver and CUDA in the same call: `bench kv` at B 8 x 32k,
# 4/2 bits, on each device, then `bench gdn` (prefill T 16384, decode B 256) on each. Carries
# .carry/s38f/deltakv and .carry/vulkan; shared steps: tools/device-call.sh.
set -u
. tools/device-call.sh
bin="$PWD/.carry/s38f/deltakv"
device_header
. tools/vulkan-env.sh
kv=(bench kv --batch 8 --contexts 32768 --bits-k 4 --bits-v 2)
for dev in wgpu cuda; do
    echo "== kv $dev"
    timeout 60 "$bin" "${kv[@]}" --device $dev
done >"$out/kv-wgpu-cuda.txt" 2>&1
grep -E '^==|decode|copy' "$out/kv-wgpu-cuda.txt" | head -n 20
echo "kv done at ${SECONDS}s"
for dev in wgpu cuda; do
    echo "== gdn $dev"
    timeout 90 "$bin" bench gdn --device $dev --seq-lens 16384 --decode-batches 256
done >"$out/gdn-wgpu-cuda.txt" 2>&1
grep -E '^==|T=16384|B=256|copy' "$out/gdn-wgpu-cuda.txt" | head -n 16
echo "done at ${SECONDS}s"
