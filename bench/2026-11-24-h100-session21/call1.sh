#!/bin/bash
# Session 21, call 1: where the walks' chunk steps spend their time (main 1921076 = 4c0b63f's
# kernels): ncu source counters (warp stall samples per SASS instruction) of the first
# gdn_prefill_lead_k128 and gdn_prefill_overlap_k128 launches at T 16384, plus their summaries.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for kernel in lead overlap; do
  timeout 200 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill_${kernel}_k128 -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --import-source no -o "$logs/$kernel" .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
    > "$logs/$kernel-run.txt" 2>&1
  say "$kernel ncu exit $? ($SECONDS s)"
  ncu --import "$logs/$kernel.ncu-rep" > "$logs/$kernel-details.txt" 2>&1
  ncu --import "$logs/$kernel.ncu-rep" --page source --csv --print-source sass > "$logs/$kernel-source.csv" 2>&1
  say "$kernel: $(grep -E 'Duration|Issue Slots Busy|Warp Cycles Per Issued|Tensor' "$logs/$kernel-details.txt" | tr -s ' ' | tr '\n' ';')"
  gzip -k "$logs/$kernel-source.csv"; cp "$logs/$kernel-source.csv.gz" "$logs/$kernel-details.txt" "$out/"
done
tar -czf "$out/logs.tar.gz" -C "$logs" --exclude='*.ncu-rep' .
