#!/usr/bin/env bash
# Session 32, call 5 (H200): the CUDA suites whose tests changed after call 4 (e7416e2: the
# prefill suite from the contract, now with the wgpu-only cases too; the decode refusals from
# the contract; the paged KV tests' chunked fill from the contract), then compute-sanitizer
# memcheck over the paged cache's append tests (its host bookkeeping moved to the contract).
# Carries .carry/deltakv, .carry/s32d.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in .carry/s32d/*; do
    name=$(basename "$t")
    DELTAKV_BIN="$PWD/.carry/deltakv" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    echo "== $name" >>"$out/tests.txt"; cat "/tmp/$name.log" >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
grep -hE 'K=37|wide tiles|GQA 8|refus|worst' "$out/tests.txt" | head -n 12
echo "tests done at ${SECONDS}s"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 .carry/s32d/deltakv-cuda-kv_paged \
    --test-threads=1 a_failed_append a_prepared_launch >"$out/memcheck-kv.txt" 2>&1
echo "memcheck rc $?: $(grep -h 'ERROR SUMMARY\|test result' "$out/memcheck-kv.txt" | tr '\n' ' ')"
echo "done at ${SECONDS}s"
