#!/bin/bash
# Session 26, call 10: the ldmatrix lane offset written once (`ldsm_lane_offset` in
# gdn_prefill.cu, used by frag_a_ldsm, frag_b2_rowmajor and the prepare's scaled_t_rows); the
# prepare's SASS changes (80 instructions over its nine kernels). The prefill suites, then
# `bench gdn` beside main's binary (.carry/deltakv-main, 4529366), alternating three times.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1), worst final $(grep -ho 'final_state [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $2}' | sort -g | tail -n 1) ($SECONDS s)"
b() { local name=$1 bin=$2
  timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b warm deltakv
for i in 1 2 3; do b main_$i deltakv-main; b new_$i deltakv; done
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
