#!/bin/bash
# Session 20, call 3: the masked stores' decays loaded once per row and column pair
# (FragmentDecays) in both prepare forms: the lab (mma.sync against wgmma, both with it), the
# prefill suites (wgmma default and DELTAKV_PREFILL_PREPARE=mma-sync), sanitizers, and bench of
# base (the session's start), w (wgmma) and w with mma-sync.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for lab in prefill_lab; do
  timeout 150 .carry/$lab > "$logs/$lab.txt" 2>&1
  say "== $lab exit $?"; grep -h "us \|cycles\|FAIL" "$logs/$lab.txt" | cut -c1-330 >> "$sum"
done
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)"
DELTAKV_PREFILL_PREPARE=mma-sync timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-mma-sync.log" 2>&1
say "mma-sync suite exit $?: $(grep 'test result' "$logs/t-mma-sync.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-mma-sync.log" | awk '{print $3}' | sort -g | tail -n 1)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log")"
done
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 90 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b base1 deltakv-base; b w1 deltakv; b sync1 deltakv DELTAKV_PREFILL_PREPARE=mma-sync
b base2 deltakv-base; b w2 deltakv; b sync2 deltakv DELTAKV_PREFILL_PREPARE=mma-sync
tar -czf "$out/logs.tar.gz" -C "$logs" .
