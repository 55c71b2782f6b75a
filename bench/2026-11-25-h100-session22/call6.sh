#!/bin/bash
# Session 22, call 6: why the register-state lead (row 40, .carry/deltakv) takes ~1.3 us a chunk:
# ncu source counters (warp stall samples per SASS instruction) of the lead at T 16384, beside
# the warpgroups' lead (DELTAKV_PREFILL_LEAD=warpgroups) in the same call.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
p() { local name=$1 kernel=$2; shift 2
  env "$@" timeout 200 ncu --clock-control none --graph-profiling node -k regex:$kernel -c 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --import-source no -o "$logs/$name" .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
    > "$logs/$name-run.txt" 2>&1
  say "$name ncu exit $? ($SECONDS s)"
  ncu --import "$logs/$name.ncu-rep" > "$out/$name-details.txt" 2>&1
  ncu --import "$logs/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/$name-source.csv.gz"
  say "$name: $(grep -E 'Duration|Issue Slots Busy|Warp Cycles Per Issued|Memory Throughput|DRAM Throughput' "$out/$name-details.txt" | tr -s ' ' | tr '\n' ';')"
}
p lead_regs gdn_prefill_lead_regs_k128
p lead_wg gdn_prefill_lead_k128 DELTAKV_PREFILL_LEAD=warpgroups
say "done ($SECONDS s)"
