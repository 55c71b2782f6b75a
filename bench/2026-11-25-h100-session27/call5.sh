#!/usr/bin/env bash
# Session 27, call 5: the CUDA KV suite with two more misaligned schemes (the eight-lane
# kernels' grid path at d 128 for f16 and f32 inputs, reached by default now), in both encode
# forms, and memcheck over the encode test. Carry: .carry/deltakv, .carry/tests.
set -u
out=${OUT:-gpu-check-out}; mkdir -p "$out"; sum=$out/summary.txt; : > "$sum"
for form in default lanes8; do
    env $([ $form = lanes8 ] && echo DELTAKV_KV_ENCODE=lanes8) .carry/tests/deltakv-cuda-kv_paged \
        --test-threads=1 --nocapture > "$out/kv-$form.log" 2>&1
    echo "kv_paged ($form) exit $?: $(grep -c 'pool identical' "$out/kv-$form.log") encode schemes identical; $(grep 'test result' "$out/kv-$form.log")" >> "$sum"
done
compute-sanitizer --tool memcheck --error-exitcode 9 .carry/tests/deltakv-cuda-kv_paged --test-threads=1 encode > "$out/memcheck.log" 2>&1
echo "memcheck (encode) exit $?: $(grep SUMMARY "$out/memcheck.log")" >> "$sum"
grep -h 'encode scheme' "$out/kv-default.log" >> "$sum"
