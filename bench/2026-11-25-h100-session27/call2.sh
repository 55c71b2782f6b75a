#!/usr/bin/env bash
# Session 27, call 2: KV row 27 (host-built grid cells copied by cp.async, the first pass's
# copies and the destination lookup before one wait) through `tools/gpu-check.sh kv-encode`,
# beside row 26's build (.carry/deltakv-base, 5878048) in the same turns; then ncu's
# per-instruction stall samples of the one-lane kernel (source page as CSV).
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
out=${OUT:-gpu-check-out}
OUT=$out tools/gpu-check.sh kv-encode
ncu -k regex:kv_encode_lane -c 1 --section SourceCounters --section WarpStateStats -o /tmp/enc \
    .carry/deltakv bench kv --device cuda --batch 1 --contexts 4096 >/tmp/ncu-src.log 2>&1
ncu -i /tmp/enc.ncu-rep --page source --csv --print-source sass >"$out/enc-sass.csv" 2>>/tmp/ncu-src.log
tail -n 5 /tmp/ncu-src.log >"$out/ncu-src-tail.txt"
gzip -f "$out/enc-sass.csv"
