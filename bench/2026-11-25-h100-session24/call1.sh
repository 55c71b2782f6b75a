#!/bin/bash
# Session 24, call 1 (kernel log row 42; .carry/deltakv and the test executables built from the
# working tree named in the session's commit): the prepare of row 41 again, with the raw q rows
# of the K > 128 lockstep pass staged in A's and T's shared-memory space (compile-time), the L2
# prefetch knob removed; the KV pages kernel on common.cuh's bulk-copy helpers. The prefill suites
# (default, checkpoints, streams, lockstep, the sm_90 mma.sync fallback), the CUDA KV suite,
# compute-sanitizer, then `bench gdn` and `bench kv` against main 07fc2c0's kernels
# (.carry/deltakv-base, built from 1be4cf0, whose kernels are 07fc2c0's) in the same call, twice each.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
k() { local name=$1 bin=$2
  { timeout 100 .carry/$bin bench kv --device cuda --batch 8 --contexts 32768 && timeout 100 .carry/$bin bench kv --device cuda --batch 1 --contexts 131072; } > "$logs/kv-$name.txt" 2>&1
  say "kv $name exit $?: $(grep -h 'pages\|encode' "$logs/kv-$name.txt" | awk '{for (i = 1; i <= NF; i++) if ($i == "us") print $2, $3, $(i - 1)}' | tr '\n' ';')"
}
b warm deltakv
for suite in gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams kv_paged; do
  DELTAKV_BIN="$PWD/.carry/deltakv" timeout 150 .carry/tests/deltakv-cuda-$suite --test-threads=1 --nocapture > "$logs/t-$suite.log" 2>&1
  say "$suite exit $?: $(grep 'test result' "$logs/t-$suite.log") $(grep -h 'panicked' "$logs/t-$suite.log" | head -3 | cut -c1-300)"
done
say "worst o: $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1), worst final $(grep -ho 'final_state [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $2}' | sort -g | tail -n 1); kv $(grep -h 'worst rel_rms' "$logs/t-kv_paged.log" | tail -n 1) ($SECONDS s)"
for mode in "DELTAKV_PREFILL_STATE=lockstep" "DELTAKV_CUDA_ARCH=sm_90"; do
  env $mode timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-$mode.log" 2>&1
  say "$mode suite exit $?: $(grep 'test result' "$logs/t-$mode.log"); worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-$mode.log" | awk '{print $3}' | sort -g | tail -n 1) $(grep -h 'panicked' "$logs/t-$mode.log" | head -2 | cut -c1-300)"
done
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 gate_extremes > "$logs/$tool.log" 2>&1
  say "$tool gate_extremes exit $?: $(grep SUMMARY "$logs/$tool.log") ($SECONDS s)"
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 .carry/tests/deltakv-cuda-kv_paged --test-threads=1 > "$logs/kv-$tool.log" 2>&1
  say "$tool kv_paged exit $?: $(grep SUMMARY "$logs/kv-$tool.log") ($SECONDS s)"
done
b base1 deltakv-base; b new1 deltakv; b base2 deltakv-base; b new2 deltakv
k base1 deltakv-base; k new1 deltakv; k base2 deltakv-base; k new2 deltakv
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
