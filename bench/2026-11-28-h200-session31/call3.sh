#!/usr/bin/env bash
# Session 31, call 3 (H200): the submitted code's host changes on the GPU (the decode's inputs
# held by the contract's DecodeTensors on CUDA and wgpu; the wgpu checkpoint table from the
# contract) and the driver's statistics of the wgpu attention as launched. Through NVIDIA's
# Vulkan driver: pipeline_stats (kv_attend and the bands decode, the table's form and the
# launched one), the wgpu decode, KV, checkpoint and fallback suites (CI=true: no skipping),
# the facade's device tensors; on CUDA: the decode suite, then compute-sanitizer memcheck over
# it; `bench gdn` decode on both devices. Carries .carry/deltakv, .carry/pipeline_stats,
# .carry/tests3, .carry/vulkan.
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
timeout 60 .carry/pipeline_stats kv_attend_subgroup gdn_decode_bands >"$out/pipeline-stats.txt" 2>&1
grep -E '4.0\), \("BITS_V", 2.0\), \("LANES", 8.0|ROWS", 16.0' "$out/pipeline-stats.txt" |
    sed 's/Binary Size [0-9]*, //' | head -n 8
t=.carry/tests3
for test in deltakv-wgpu-gdn_decode deltakv-wgpu-kv_paged deltakv-wgpu-gdn_prefill_checkpoints \
    deltakv-wgpu-prefill_fallbacks deltakv-device_tensor deltakv-cuda-gdn_decode; do
    timeout 120 "$t/$test" --test-threads=1 --nocapture >"/tmp/$test.log" 2>&1
    echo "$test rc $?: $(grep -h 'test result' "/tmp/$test.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$test.log" | head -n 2)"
    { echo "== $test"; cat "/tmp/$test.log"; } >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
echo "tests done at ${SECONDS}s"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$t/deltakv-cuda-gdn_decode" \
    --test-threads=1 >"$out/memcheck-decode.txt" 2>&1
echo "memcheck (cuda decode suite) rc $?: $(grep -h 'ERROR SUMMARY\|test result' "$out/memcheck-decode.txt" | tr '\n' ' ')"
for dev in cuda wgpu; do
    timeout 60 .carry/deltakv bench gdn --device $dev --seq-lens 1024 --decode-batches 1,256
done >"$out/bench-decode.txt" 2>&1
grep -E 'B=1 |B=256|copy' "$out/bench-decode.txt" | head -n 14
echo "done at ${SECONDS}s"
