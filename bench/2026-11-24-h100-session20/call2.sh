#!/bin/bash
# Session 20, call 2: the prepare on wgmma with both warpgroups over half the columns of K K^T and
# Q K^T (K K^T kept in registers, as the mma.sync form): the lab, ncu over the lab's
# reference and wgmma variant (stall reasons), the prefill suites, sanitizers, bench against
# the session's starting binary (base).
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for lab in prefill_lab; do
  timeout 150 .carry/$lab > "$logs/$lab.txt" 2>&1
  say "== $lab exit $?"; grep -h "us \|cycles\|FAIL" "$logs/$lab.txt" | cut -c1-330 >> "$sum"
done
for k in "gdn_prefill_prepare_mma_k128_v128 21" "lab_prepare_wgmma_k128_v128 0"; do
  set -- $k
  timeout 100 ncu --kernel-name "$1" --launch-skip "$2" --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" .carry/prefill_lab > "$logs/ncu-$1.txt" 2>&1
  say "ncu $1 exit $?: $(grep -h 'Duration\|Issue Slots Busy\|No Eligible\|Warp Cycles Per Issued\|L1/TEX Hit\|Shared Memory\|Mem Pipes Busy\|Stall' "$logs/ncu-$1.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-900)"
done
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log")"
done
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 90 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base1 deltakv-base; b w1 deltakv; b base2 deltakv-base; b w2 deltakv
tar -czf "$out/logs.tar.gz" -C "$logs" .
