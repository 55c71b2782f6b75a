#!/usr/bin/env bash
# Session 31, call 6 (H200): the attention's query checks now in the contract
# (kv::paged::check_query_tensor, used by the CUDA and wgpu launches): the CUDA and wgpu KV
# suites and the CLI's device tests (`kv --device cuda|wgpu` against cpu) on the submitted code.
# Carries .carry/deltakv, .carry/tests6, .carry/vulkan.
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
for t in .carry/tests6/*; do
    name=$(basename "$t")
    timeout 60 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    { echo "== $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
grep -h 'worst rel_rms\|against --device cpu' "$out/tests.txt" | head -n 8
echo "done at ${SECONDS}s"
