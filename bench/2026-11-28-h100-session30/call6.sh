#!/usr/bin/env bash
# Session 30, call 6: the compressed-KV decode on wgpu through NVIDIA's Vulkan driver beside
# CUDA's in the same call, at issue 13's shape (B 8, 32k context, Hq 32, Hkv 8, d 128, 4/2
# bits): `bench kv --device wgpu`, then `--device cuda`. Carries .carry/deltakv, .carry/vulkan.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for f in .carry/vulkan/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! ls /usr/share/vulkan/icd.d/nvidia_icd*.json >/dev/null 2>&1 && [ -e "$icd" ]; then
    export VK_DRIVER_FILES="$icd"
fi
export XDG_RUNTIME_DIR="$(mktemp -d)"
for device in wgpu cuda; do
    timeout 110 .carry/deltakv bench kv --device "$device" --batch 8 --contexts 32768 --bits-k 4 \
        --bits-v 2 >>"$out/bench-kv.txt" 2>&1
    echo "$device rc $?"
done
grep -E "copy|decode +B=8 ctx=32768|splits:" "$out/bench-kv.txt" | sed 's/  */ /g' | head -n 12
echo "done at ${SECONDS}s"
