#!/usr/bin/env bash
# Session 30, call 2: the pages form with 2-bit values as bit planes (kernel log KV row 40,
# `kv_attend_planes_*`, the default where it applies) against the same binary's level-table
# values (DELTAKV_KV_VALUES=tables). The CUDA KV suite with the default (every bits pair against
# the f64 oracle and the CPU), its attention test with the tables; memcheck and racecheck over
# the attention test; tools/compare_sdpa.py (SDPA over bf16 in the same call) three times:
# planes, tables, planes. Carries .carry/deltakv and .carry/tests/deltakv-cuda-kv_paged.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
t=.carry/tests/deltakv-cuda-kv_paged
DELTAKV_BIN="$PWD/.carry/deltakv" "$t" --test-threads=1 --nocapture >"$out/tests-planes.txt" 2>&1
grep -E "test result|panicked|worst rel_rms" "$out/tests-planes.txt"
DELTAKV_KV_VALUES=tables "$t" --test-threads=1 --nocapture attention_equals >"$out/tests-tables.txt" 2>&1
grep -E "test result|panicked|worst rel_rms" "$out/tests-tables.txt"
echo "tests done at ${SECONDS}s"
for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --test-threads=1 \
        attention_equals >"$out/sanitizer-$tool.txt" 2>&1
    echo "$tool rc $?: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/sanitizer-$tool.txt" | tail -n 1)"
done
echo "sanitizers done at ${SECONDS}s"
for values in planes tables planes; do
    echo "== $values" | tee -a "$out/compare-sdpa.txt"
    DELTAKV_KV_VALUES=$values timeout $((580 - SECONDS)) python3 tools/compare_sdpa.py \
        --deltakv .carry/deltakv >>"$out/compare-sdpa.txt" 2>&1
    grep -E "^ *[18] |x SDPA|PASS|FAIL" "$out/compare-sdpa.txt" | tail -n 6
done
echo "done at ${SECONDS}s"
