#!/usr/bin/env bash
# Session 32, call 2 (H200): stages FlashInfer 0.7.2's payload part 1 (.fi/1) for call 3 on the
# same warm machine, then the relay's first-segment share on this GPU: `bench gdn --device cuda`
# (serving shapes and T 4096 / 16384) with DELTAKV_PREFILL_RELAY at 0.65, 0.7, 0.75 (the
# default, timed first and last) and 0.8, one binary (main, 7bc653d).
# Carries .fi/1, .carry/deltakv, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
mkdir -p /tmp/fi && cp .fi/1/* /tmp/fi/ && ls -la /tmp/fi | tee -a "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
for share in default 0.65 0.7 0.8 default; do
    echo "== share $share"
    if [ $share = default ]; then
        timeout 90 .carry/deltakv bench gdn --device cuda --seq-lens 4096,16384 --decode-batches 1
    else
        DELTAKV_PREFILL_RELAY=$share timeout 90 .carry/deltakv bench gdn --device cuda \
            --seq-lens 4096,16384 --decode-batches 1
    fi
    echo "at ${SECONDS}s"
done >"$out/relay-shares.txt" 2>&1
grep -E '^==|chunk|at ' "$out/relay-shares.txt" | head -n 60
echo "done at ${SECONDS}s"
