#!/bin/bash
# Session 26, call 7 (kernel log KV row 25; .carry/deltakv and the test executables built by
# `tools/gpu-check.sh build-prefill` from the working tree of the commit adding this script): the
# one-lane encode with the destination page looked up first. The CUDA KV suite
# with the one-lane kernels (default) and with the eight-lane ones (DELTAKV_KV_ENCODE=lanes8),
# memcheck, racecheck and initcheck over the encode tests, the encode of 8 x 8192 tokens by
# `bench kv` alternating both forms three times, ncu over one launch of the one-lane kernel (the
# prefill suites ran in call 1).
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
kv() { local name=$1; shift
  env "$@" timeout 150 .carry/tests/deltakv-cuda-kv_paged --test-threads=1 --nocapture > "$logs/kv-$name.log" 2>&1
  say "kv_paged ($name) exit $?: $(grep 'test result' "$logs/kv-$name.log") $(grep -c 'pool identical' "$logs/kv-$name.log") encode schemes identical $(grep -h 'panicked\|differ' "$logs/kv-$name.log" | head -3 | cut -c1-300) ($SECONDS s)"
}
kv lane
kv lanes8 DELTAKV_KV_ENCODE=lanes8
for tool in memcheck racecheck initcheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-kv_paged --test-threads=1 encode a_failed_append > "$logs/$tool.log" 2>&1
  say "$tool (encode tests) exit $?: $(grep SUMMARY "$logs/$tool.log") ($SECONDS s)"
done
enc() { local name=$1; shift
  env "$@" timeout 120 .carry/deltakv bench kv --device cuda --batch 1 --contexts 4096 > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'encode' "$logs/bench-$name.txt" | tr -s ' ') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
enc warm
for i in 1 2 3; do enc lanes8_$i DELTAKV_KV_ENCODE=lanes8; enc lane_$i; done
say "bench done ($SECONDS s)"
for form in lane; do  # stall reasons as in call 4
  env $( [ $form = lanes8 ] && echo DELTAKV_KV_ENCODE=lanes8 ) timeout 150 ncu -k regex:kv_encode_ -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section InstructionStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" .carry/deltakv bench kv --device cuda --batch 1 --contexts 4096 > "$logs/ncu-$form.txt" 2>&1
  say "ncu $form exit $?: $(grep -h 'issue_stalled' "$logs/ncu-$form.txt" | awk '$NF+0 > 0.05 {print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | tr '\n' ';') $(grep -h -E '^\s+(Duration|Executed Instructions |Issue Slots Busy|No Eligible|Achieved Occupancy|Registers Per Thread|Memory Throughput|DRAM Throughput)' "$logs/ncu-$form.txt" | tr -s ' ' | tr '\n' ';')"
done
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
