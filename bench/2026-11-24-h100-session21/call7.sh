#!/bin/bash
# Session 21, call 7: where the time goes after row 36 (f6a8651's kernels, .carry/deltakv): ncu
# source counters (warp stall samples per SASS instruction) of the first prepare, overlapped
# walk and lead launches at T 16384, for the next version.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for kernel in overlap lead prepare_mma; do
  timeout 170 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill_${kernel}_k128 -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --import-source no -o "$logs/$kernel" .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
    > "$logs/$kernel-run.txt" 2>&1
  say "$kernel ncu exit $? ($SECONDS s)"
  ncu --import "$logs/$kernel.ncu-rep" > "$out/$kernel-details.txt" 2>&1
  ncu --import "$logs/$kernel.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/$kernel-source.csv.gz"
  say "$kernel: $(grep -E 'Duration|Issue Slots Busy|Warp Cycles Per Issued' "$out/$kernel-details.txt" | tr -s ' ' | tr '\n' ';')"
done
