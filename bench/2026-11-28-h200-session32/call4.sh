#!/usr/bin/env bash
# Session 32, call 4 (H200): the submitted code a077111 on the GPU. Its CUDA host-side changes
# (the contract's checkpoint table, the paged cache's book, the decode's device paths) under the
# CUDA suites (paged KV, decode, prefill, checkpoints) and the CLI's device tests; then the
# prefill beside FLA 0.6 with the relay share 0.7 as the default (`bench gdn --device cuda`,
# `tools/compare_fla_prefill.py --skip-accuracy`) and `bench kv --device cuda` (B 8 x 32k, 4/2).
# Carries .carry/deltakv, .carry/s32c, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in .carry/s32c/*; do
    name=$(basename "$t")
    DELTAKV_BIN="$PWD/.carry/deltakv" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    echo "== $name" >>"$out/tests.txt"; cat "/tmp/$name.log" >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "tests done at ${SECONDS}s"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
.carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
    --json /tmp/deltakv-prefill.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 200 python3 tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv \
    --csv "$out/prefill-vs-fla.csv" >"$out/compare-fla.txt" 2>&1
tail -n 8 "$out/compare-fla.txt"
echo "fla done at ${SECONDS}s"
timeout 90 .carry/deltakv bench kv --device cuda --batch 8 --contexts 32768 --bits-k 4 --bits-v 2 \
    >"$out/bench-kv.txt" 2>&1
grep -E 'copy|encode|decode' "$out/bench-kv.txt" | head -n 8
echo "done at ${SECONDS}s"
