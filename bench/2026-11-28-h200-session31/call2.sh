#!/usr/bin/env bash
# Session 31, call 2 (H200): call 1's `run quick` ran out of time before its summary and FLA's
# prefill, so here: the CUDA GDN test executables again (pass/fail and figures), FLA's
# chunk_gated_delta_rule beside `bench gdn --device cuda` (speed only), then through NVIDIA's
# Vulkan driver `bench kv --device wgpu` (B 8 x 32k, 4/2 bits) with the KV attention's timing
# trials (.carry/deltakv-trial, branch kv-wgpu-trials, DELTAKV_WGPU_KV_TRIAL: 1 no key level
# table, 2 no q' loads, 4 no value level table, 8 no values, 16 no key dots, 32 2-bit value
# levels by selects, the only trial with right results), `bench kv --device cuda` and `bench
# gdn --device wgpu|cuda` (decode B 256, prefill T 16384).
# Carries .carry/deltakv, .carry/deltakv-trial, .carry/tests2, .carry/vulkan, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in .carry/tests2/*; do
    name=$(basename "$t")
    timeout 100 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    echo "== $name" >>"$out/tests.txt"; cat "/tmp/$name.log" >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
echo "tests done at ${SECONDS}s"
.carry/deltakv bench gdn --device cuda --seq-lens 1024,4096,16384,65536 --decode-batches 1 \
    --json /tmp/deltakv-prefill.json >/tmp/bench-cuda.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
PYTHONPATH=/tmp/fla-site timeout 150 python3 tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv \
    --csv "$out/prefill-vs-fla.csv" >"$out/compare-fla-prefill.txt" 2>&1
cat /tmp/bench-cuda.txt >>"$out/compare-fla-prefill.txt"
tail -n 14 "$out/compare-fla-prefill.txt"
echo "fla done at ${SECONDS}s"
for f in .carry/vulkan/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! ls /usr/share/vulkan/icd.d/nvidia_icd*.json >/dev/null 2>&1 && [ -e "$icd" ]; then
    export VK_DRIVER_FILES="$icd"
fi
export XDG_RUNTIME_DIR="$(mktemp -d)"
kv=(bench kv --batch 8 --contexts 32768 --bits-k 4 --bits-v 2)
{
    for trial in 0 1 2 4 8 16 32 0 32; do
        echo "== trial $trial"
        DELTAKV_WGPU_KV_TRIAL=$trial timeout 60 .carry/deltakv-trial "${kv[@]}" --device wgpu
    done
    echo "== main"
    timeout 60 .carry/deltakv "${kv[@]}" --device wgpu
    echo "== cuda"
    timeout 60 .carry/deltakv "${kv[@]}" --device cuda
} >"$out/kv-trials.txt" 2>&1
grep -E '^==|decode' "$out/kv-trials.txt" | grep -v '^$' | head -n 40
echo "kv done at ${SECONDS}s"
for dev in wgpu cuda; do
    timeout 90 .carry/deltakv bench gdn --device $dev --seq-lens 16384 --decode-batches 256
done >"$out/gdn-wgpu-cuda.txt" 2>&1
grep -E 'T=16384|B=256|copy' "$out/gdn-wgpu-cuda.txt" | head -n 12
echo "done at ${SECONDS}s"
