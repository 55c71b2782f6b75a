#!/usr/bin/env bash
# Session 30, call 1: ce2f81a (main at the session's start) on the H100. The wgpu state
# checkpoints stored by the walk, the pooled prefill, the fallbacks and the state-walk shapes
# through NVIDIA's Vulkan driver; the facade's pooled prefill; `bench gdn
# --device wgpu --checkpoint-every 1024` alternating with d319605's binary (.carry/deltakv-base:
# scan-form checkpoints, state walks without the checkpoint bindings); then the CUDA prefill
# beside FLA's chunk_gated_delta_rule (tools/compare_fla_prefill.py, speed only).
# Carries .carry/deltakv, .carry/deltakv-base, .carry/tests, .carry/vulkan, .whl.
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
    "$t/deltakv-wgpu-prefill_state_shapes" --test-threads=1 --nocapture
    "$t/deltakv-prefill_pool" --test-threads=1 --nocapture
} >"$out/tests.txt" 2>&1
grep -E "test result|FAILED|panicked|skipped|pooled|facade|one pass T|token loop T|worst" "$out/tests.txt" | head -n 40
echo "tests done at ${SECONDS}s"
for build in deltakv deltakv-base deltakv; do
    echo "== $build" >>"$out/bench-wgpu.txt"
    timeout 100 ".carry/$build" bench gdn --device wgpu --seq-lens 16384 --modes chunk \
        --checkpoint-every 1024 --decode-batches 1 >>"$out/bench-wgpu.txt" 2>&1
done
grep -E "^==|chunk +T=|passes|with checkpoints" "$out/bench-wgpu.txt"
echo "wgpu bench done at ${SECONDS}s"
.carry/deltakv bench gdn --device cuda --seq-lens 1024,4096,16384,65536 --decode-batches 1 \
    --json "$out/deltakv-prefill.json" >"$out/bench-cuda.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
PYTHONPATH=/tmp/fla-site timeout $((560 - SECONDS)) python3 tools/compare_fla_prefill.py \
    --skip-accuracy --deltakv-json "$out/deltakv-prefill.json" --deltakv-bin .carry/deltakv \
    --csv "$out/prefill-vs-fla.csv" >"$out/compare-fla.txt" 2>&1
tail -n 12 "$out/compare-fla.txt"
echo "done at ${SECONDS}s"
