#!/usr/bin/env bash
# Session 31, call 5 (H200): the submitted code's remaining wgpu suites through NVIDIA's Vulkan
# driver (CI=true: no skipping): the chunked prefill, the state-walk shapes, the shared-memory
# path, the tensors, the cooperative matrices (DELTAKV_WGPU_COOP=1), the KV suite, and the CLI's
# device tests (`gdn`, `gdn-decode`, `kv` with --device cuda|wgpu against --device cpu).
# Calls 2-3 ran the rest on the same code. Carries .carry/deltakv, .carry/tests5, .carry/vulkan.
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
export XDG_RUNTIME_DIR="$(mktemp -d)" CI=true DELTAKV_BIN="$PWD/.carry/deltakv"
for t in .carry/tests5/*; do
    name=$(basename "$t")
    coop=$([ "$name" = deltakv-wgpu-coop_matrix ] && echo 1 || echo 0)
    DELTAKV_WGPU_COOP=$coop timeout 60 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    { echo "== $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
    echo "  at ${SECONDS}s"
done | tee "$out/tests-summary.txt"
grep -h 'worst rel_rms\|against --device cpu\|matrices' "$out/tests.txt" | head -n 20
echo "done at ${SECONDS}s"
