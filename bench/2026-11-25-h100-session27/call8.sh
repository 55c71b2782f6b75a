#!/usr/bin/env bash
# Session 27, call 8: ncu's per-instruction stall samples of the one-lane encode as main has it
# (row 28, ed888fe), the source page as CSV, for the next step's reading. Carry: .carry/deltakv.
set -u
out=${OUT:-gpu-check-out}; mkdir -p "$out"
ncu -k regex:kv_encode_lane -c 1 --section SourceCounters --section WarpStateStats \
    --section SchedulerStats -o /tmp/enc .carry/deltakv bench kv --device cuda --batch 1 \
    --contexts 4096 > "$out/ncu.log" 2>&1
ncu -i /tmp/enc.ncu-rep --page details > "$out/ncu-details.txt" 2>&1
ncu -i /tmp/enc.ncu-rep --page source --csv --print-source sass > "$out/enc-sass.csv" 2>> "$out/ncu.log"
gzip -f "$out/enc-sass.csv"
tail -n 3 "$out/ncu.log"
