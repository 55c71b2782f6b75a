#!/usr/bin/env bash
# Session 36, call 4 (H200): main 9ebf953's build (the prefill's host launches as LoadedKernel;
# kernels as d28b07c's, SASS identical): the CUDA prefill suites, the checkpoint and stream
# tests, the pooled prefill and the CLI's device tests; memcheck over the checkpoint tests and
# racecheck over them forced to the one-stage outputs walk. Stages FlashInfer 0.7.2's payload
# part 1 (.fi/1) for call 5 on the same warm machine.
# Carries .fi/1 and .carry/s36a (release binary `--features cuda,wgpu` and the test executables
# it runs).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
mkdir -p /tmp/fi && cp .fi/1/* /tmp/fi/ && ls -la /tmp/fi >>"$out/gpu.txt"
for t in .carry/s36a/tests/*; do
    name=$(basename "$t")
    DELTAKV_BIN="$PWD/.carry/s36a/deltakv" timeout 120 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    { echo "== $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
echo "tests done at ${SECONDS}s"
timeout 100 compute-sanitizer --tool memcheck .carry/s36a/tests/deltakv-cuda-gdn_prefill_checkpoints \
    --test-threads=1 >/tmp/memcheck.txt 2>&1
echo "memcheck rc $?: $(tail -n 1 /tmp/memcheck.txt)" | tee "$out/sanitizers.txt"
DELTAKV_PREFILL_OUTPUT_STAGES=1 timeout 100 compute-sanitizer --tool racecheck \
    .carry/s36a/tests/deltakv-cuda-gdn_prefill_checkpoints --test-threads=1 >/tmp/racecheck.txt 2>&1
echo "racecheck (one stage) rc $?: $(tail -n 1 /tmp/racecheck.txt)" | tee -a "$out/sanitizers.txt"
echo "done at ${SECONDS}s"
