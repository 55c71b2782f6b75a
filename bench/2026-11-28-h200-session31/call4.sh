#!/usr/bin/env bash
# Session 31, call 4 (H200): the wgpu attention's value step at 8 and 4 dimensions per lane
# (`WgpuAttnOptions::lane_dims`, pipeline constant LANE_DIMS; half the accumulators) beside the
# default 16. Call 3's statistics put the launched kv_attend at 204 registers a thread, two
# 128-thread workgroups per SM, which is why 8 splits were no faster than 4. Here: the driver's
# statistics of both forms as launched, the wgpu KV suite (both forms, every bits pair) and
# `bench kv --device wgpu` (its sweep times the 8- and 4-dimension forms at 1, 1.5 and 2 times the
# default splits). Carries .carry/deltakv, .carry/pipeline_stats, .carry/tests4-kv_paged,
# .carry/vulkan.
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
export XDG_RUNTIME_DIR="$(mktemp -d)" CI=true
timeout 60 .carry/pipeline_stats kv_attend_subgroup >"$out/pipeline-stats.txt" 2>&1
grep -E 'as launched' "$out/pipeline-stats.txt" | sed 's/Binary Size [0-9]*, //' | grep -E '"BITS_K", 4.0\), \("BITS_V", 2.0' 
timeout 120 .carry/tests4-kv_paged --test-threads=1 --nocapture >"$out/kv-tests.txt" 2>&1
echo "kv_paged rc $?: $(grep -h 'test result\|worst' "$out/kv-tests.txt" | tr '\n' ' ')"
for run in 1 2; do
    timeout 90 .carry/deltakv bench kv --device wgpu --batch 8 --contexts 32768 --bits-k 4 --bits-v 2
done >"$out/bench-kv.txt" 2>&1
grep -E 'decode|splits' "$out/bench-kv.txt"
echo "done at ${SECONDS}s"
