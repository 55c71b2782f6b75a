#!/bin/bash
# Session 26, call 9: the prefill's state sources moved to their own module (host code only;
# `tools/gpu-check.sh build-prefill` from the commit adding this script): the prefill suites
# (default, checkpoints, streams; the pool-indexed prefill and decode are in the first), and the
# lockstep state pass.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1), worst final $(grep -ho 'final_state [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $2}' | sort -g | tail -n 1) ($SECONDS s)"
DELTAKV_PREFILL_STATE=lockstep timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-lockstep.log" 2>&1
say "lockstep suite exit $?: $(grep 'test result' "$logs/t-lockstep.log") ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
