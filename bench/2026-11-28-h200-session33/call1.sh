#!/usr/bin/env bash
# Session 33, call 1 (H200): main 0563c33 on the GPU. Its three commits not run there before
# (83790f9 the relay's rule, 056501a the CUDA cache's table copy before its book keeps it,
# 0563c33 the table planned once) under the CUDA suites (decode, prefill, checkpoints, streams,
# paged KV), the facade's device tests, and the wgpu suites (decode, prefill, paged KV) through
# NVIDIA's Vulkan driver (tools/vulkan-env.sh). Then where the relay starts paying on the H200:
# `bench gdn --device cuda` at T 1024 to 3072 with the default threshold (sequences of at most
# 40 chunks walked whole) and with DELTAKV_PREFILL_RELAY_MIN_CHUNKS=8 (relayed from 9 chunks),
# twice each, alternating.
# Carries .carry/deltakv, .carry/s33, .carry/vulkan.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
run_tests() {
    for t in "$@"; do
        name=$(basename "$t")
        DELTAKV_BIN="$PWD/.carry/deltakv" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
        echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
        echo "== $name" >>"$out/tests.txt"; cat "/tmp/$name.log" >>"$out/tests.txt"
    done
}
run_tests .carry/s33/deltakv-cuda-* .carry/s33/deltakv-main-* | tee "$out/tests-summary.txt"
echo "cuda tests done at ${SECONDS}s"
(
    . tools/vulkan-env.sh >/dev/null 2>&1
    run_tests .carry/s33/deltakv-wgpu-*
) | tee -a "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "wgpu tests done at ${SECONDS}s"
lens=1024,1536,2048,2560,3072
for run in 1 2; do
    for min in default 8; do
        echo "== run $run min_chunks $min"
        if [ $min = default ]; then
            timeout 80 .carry/deltakv bench gdn --device cuda --seq-lens $lens --decode-batches 1
        else
            DELTAKV_PREFILL_RELAY_MIN_CHUNKS=$min timeout 80 .carry/deltakv bench gdn --device cuda \
                --seq-lens $lens --decode-batches 1
        fi
        echo "at ${SECONDS}s"
    done
done >"$out/relay-min.txt" 2>&1
grep -E '^==|B=1  T=(1024|1536|2048|2560|3072) ' "$out/relay-min.txt" | head -n 40
echo "done at ${SECONDS}s"
