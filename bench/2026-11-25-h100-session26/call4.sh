#!/bin/bash
# Session 26, call 4 (main's kernels: KV row 20, 9a67e20's build): where the one-lane encode's
# warps stall. ncu over one launch of the one-lane and of the eight-lane encode, the average
# warps stalled per issued instruction by reason, and the source counters' top stall sites.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for form in lane lanes8; do
  env $( [ $form = lanes8 ] && echo DELTAKV_KV_ENCODE=lanes8 ) timeout 200 ncu -k regex:kv_encode_ -c 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    --section WarpStateStats --section SourceCounters --section InstructionStats \
    .carry/deltakv bench kv --device cuda --batch 1 --contexts 4096 > "$logs/ncu-$form.txt" 2>&1
  say "ncu $form exit $?: $(grep -h 'issue_stalled' "$logs/ncu-$form.txt" | awk '$NF+0 > 0.05 {print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | tr '\n' ';')"
done
cp "$logs"/ncu-*.txt "$out/"
say "done ($SECONDS s)"
