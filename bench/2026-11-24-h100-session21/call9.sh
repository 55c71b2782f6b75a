#!/bin/bash
# Session 21, call 9: call 8's `bench gdn` printed nothing within 90 s; the same command alone on
# a fresh machine (f6a8651's binary), timed, with a longer limit.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for run in 1 2; do
  start=$SECONDS
  timeout 240 .carry/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 > "$out/bench$run.txt" 2>&1
  say "run $run exit $? in $((SECONDS - start)) s: $(grep -h 'B=' "$out/bench$run.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
done
