#!/usr/bin/env bash
# Session 37, call 2 (H200, the machine call 1 left warm): the two suites call 1's time left out
# (device tensors, pooled prefill + decode), on the same build of main 495983f (.carry/s37).
set -u
out=${OUT:-gpu-check-out}
bin="$PWD/.carry/s37/deltakv"
mkdir -p "$out"
for t in .carry/s37/tests/deltakv-device_tensor .carry/s37/tests/deltakv-prefill_pool; do
    name=$(basename "$t")
    DELTAKV_BIN="$bin" timeout 200 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    { echo "== $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
echo "done at ${SECONDS}s"
