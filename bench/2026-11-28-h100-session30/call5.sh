#!/usr/bin/env bash
# Session 30, call 5: the submitted code on the H100. `bench gdn --device cuda --seq-lens
# 4096,16384` (the relay's share now 0.75), the CUDA prefill suite and checkpoint suite, then the
# wgpu checkpoint suite and the prefill fallbacks through NVIDIA's Vulkan driver (the device's
# placeholders, the refusals before upload). Carries .carry/deltakv, .carry/tests (the four
# test executables below) and .carry/vulkan.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
timeout 60 .carry/deltakv bench gdn --device cuda --seq-lens 4096,16384 --decode-batches 1 \
    >"$out/bench-cuda.txt" 2>&1
grep -h "B=1  T=4096\|B=1  T=16384\|B=8" "$out/bench-cuda.txt"
t=.carry/tests
for test in deltakv-cuda-gdn_prefill deltakv-cuda-gdn_prefill_checkpoints; do
    timeout 120 "$t/$test" --test-threads=1 --nocapture >"$out/$test.txt" 2>&1
    echo "$test rc $?: $(grep -h 'test result' "$out/$test.txt" | tail -n 1)"
done
for f in .carry/vulkan/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! ls /usr/share/vulkan/icd.d/nvidia_icd*.json >/dev/null 2>&1 && [ -e "$icd" ]; then
    export VK_DRIVER_FILES="$icd"
fi
export XDG_RUNTIME_DIR="$(mktemp -d)" CI=true
for test in deltakv-wgpu-gdn_prefill_checkpoints deltakv-wgpu-prefill_fallbacks; do
    timeout 90 "$t/$test" --test-threads=1 --nocapture >"$out/$test.txt" 2>&1
    echo "$test rc $?: $(grep -h 'test result' "$out/$test.txt" | tail -n 1)"
done
grep -h "worst" "$out"/deltakv-*.txt | grep -o "worst [0-9.e-]*\|o [0-9.e-]*, final_state [0-9.e-]*" | sort | uniq -c | sort -rn | head -n 4
echo "done at ${SECONDS}s"
