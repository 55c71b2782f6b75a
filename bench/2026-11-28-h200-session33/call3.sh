#!/usr/bin/env bash
# Session 33, call 3 (H200): (1) the relay from 16 chunks (RELAY_MIN_CHUNKS 15, 46e7e46 and
# after) under the CUDA prefill suites, checkpoints, streams, the pooled prefill and the CLI's
# device tests; (2) the chain cost of a step that needs no W or U (FlashInfer's form, V' =
# T diag(beta) (V - diag(exp G) K S)): ncu's durations of the relay's kernels at B 1, T 16384
# with the library's lead (0) and the lead's timing trial (DELTAKV_CUDA_DEFINES=PF_WALK_TRIAL=1:
# K S, then one more dependent 64 x 64 x 64 product, wrong results on purpose), 0 again last.
# Carries .carry/deltakv, .carry/s33.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in .carry/s33/*; do
    name=$(basename "$t")
    DELTAKV_BIN="$PWD/.carry/deltakv" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    echo "== $name" >>"$out/tests.txt"; cat "/tmp/$name.log" >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "tests done at ${SECONDS}s"
for trial in 0 1 0; do
    DELTAKV_CUDA_DEFINES=PF_WALK_TRIAL=$trial timeout 100 ncu --clock-control none \
        -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum \
        .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
        >/tmp/ncu.txt 2>&1
    cat /tmp/ncu.txt >>"$out/ncu-walk.txt"
    echo "walk trial $trial (at ${SECONDS}s):"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
done | tee "$out/walk-trials.txt"
gzip -f "$out/ncu-walk.txt"
echo "done at ${SECONDS}s"
