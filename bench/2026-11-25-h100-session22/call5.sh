#!/bin/bash
# Session 22, call 5: the relay's lead with the state in registers (kernel log row 40, four stages;
# .carry/deltakv and the test executables built from the working tree): the prefill suites,
# compute-sanitizer, `bench gdn` against main's binary (.carry/deltakv-base) and against
# DELTAKV_PREFILL_LEAD=warpgroups in the same call, relay shares 0.55-0.7, ncu's kernel durations.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
b warm deltakv
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams; do
  timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1); Relay(9) worst o $(grep 'Relay(9)' "$logs/t-gdn_prefill.log" | grep -o ': o [0-9.e+-]*' | awk '{print $3}' | sort -g | tail -n 1) final $(grep 'Relay(9)' "$logs/t-gdn_prefill.log" | grep -o 'final_state [0-9.e+-]*' | awk '{print $2}' | sort -g | tail -n 1) ($SECONDS s)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log") ($SECONDS s)"
done
b base deltakv-base; b new deltakv; b wg deltakv DELTAKV_PREFILL_LEAD=warpgroups
b s60 deltakv DELTAKV_PREFILL_RELAY=0.6; b s65 deltakv DELTAKV_PREFILL_RELAY=0.65; b s55 deltakv DELTAKV_PREFILL_RELAY=0.55; b new2 deltakv; b base2 deltakv-base
timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/ncu.txt" 2>&1
say "ncu exit $?: $(grep -E '^  gdn|duration' "$logs/ncu.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s %s; ", name, $(NF-1), $NF}')"
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
