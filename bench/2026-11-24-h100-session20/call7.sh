#!/bin/bash
# Session 20, call 7: where the time goes at T 16384 with 9c9d4f9's kernels: ncu's duration of
# each prefill kernel of the first calls of `bench gdn` (no clock control, so at the bench's clocks).
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 150 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 12 --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/ncu.txt" 2>&1
say "ncu exit $?: $(grep -E '^  gdn|duration' "$logs/ncu.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s; ", name, $NF}')"
tar -czf "$out/logs.tar.gz" -C "$logs" .
