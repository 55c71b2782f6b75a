#!/usr/bin/env bash
# Session 29, call 1 (the session's only H100 call): wgpu state checkpoints, the pooled prefill
# and the prefill's fallbacks through NVIDIA's Vulkan driver; the facade's checkpoints and
# pooled prefill on CUDA and wgpu; `bench gdn --checkpoint-every 1024` on both devices.
# Carries .carry/deltakv, .carry/tests (the four test executables below) and .carry/vulkan.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
for f in .carry/vulkan/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! ls /usr/share/vulkan/icd.d/nvidia_icd*.json >/dev/null 2>&1 && [ -e "$icd" ]; then
    export VK_DRIVER_FILES="$icd"
fi
export XDG_RUNTIME_DIR="$(mktemp -d)" CI=true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
t=.carry/tests
{
    "$t/deltakv-wgpu-gdn_prefill_checkpoints" --test-threads=1 --nocapture
    "$t/deltakv-wgpu-prefill_fallbacks" --test-threads=1 --nocapture
    "$t/deltakv-prefill_pool" --test-threads=1 --nocapture
    "$t/deltakv-cli_gdn_checkpoints" the_facade --test-threads=1 --nocapture
} >"$out/tests.txt" 2>&1
grep -E "test result|FAILED|panicked|skipped|pooled|facade|one pass T|token loop T|every 192: [1-9]" "$out/tests.txt"
timeout 150 .carry/deltakv bench gdn --device wgpu --seq-lens 16384 --modes chunk \
    --checkpoint-every 1024 --decode-batches 1 >"$out/bench-wgpu.txt" 2>&1
grep -v "^ *$" "$out/bench-wgpu.txt" | head -n 20
timeout 120 .carry/deltakv bench gdn --device cuda --seq-lens 16384 --checkpoint-every 1024 \
    --decode-batches 1 >"$out/bench-cuda.txt" 2>&1
grep -v "^ *$" "$out/bench-cuda.txt" | head -n 20
