#!/bin/bash
# Session 24, call 8 (11e1c76's kernels, .carry/deltakv-r45): where the time goes after kernel log
# row 45, for the next version: ncu source counters (warp stall samples per SASS instruction)
# and the speed-of-light, warp-state and memory sections of the first prepare, overlapped walk
# and lead launches at T 16384.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for kernel in prepare_mma overlap lead; do
  timeout 170 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill_${kernel}_k128 -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --import-source no -o "$logs/$kernel" .carry/deltakv-r45 bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
    > "$logs/$kernel-run.txt" 2>&1
  say "$kernel ncu exit $? ($SECONDS s)"
  ncu --import "$logs/$kernel.ncu-rep" > "$out/$kernel-details.txt" 2>&1
  ncu --import "$logs/$kernel.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/$kernel-source.csv.gz"
  say "$kernel: $(grep -E 'Duration|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput' "$out/$kernel-details.txt" | tr -s ' ' | tr '\n' ';')"
done
say "done ($SECONDS s)"
