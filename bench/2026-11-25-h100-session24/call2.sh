#!/bin/bash
# Session 24, call 2 (4ef03ab's binary, .carry/deltakv): FLA 0.6 beside deltakv in the same call
# (tools/compare_fla_prefill.py, speed only) for the README's ratios; ncu's per-kernel durations
# at T 16384; ncu source counters (warp stall samples per SASS instruction) of the prepare after
# kernel log row 42, for the next version.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
b new1 deltakv; b new2 deltakv
if python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl > "$logs/pip.txt" 2>&1; then
  PYTHONPATH=/tmp/fla-site timeout 240 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json "$logs/new2.json" --deltakv-bin .carry/deltakv --csv "$out/prefill-vs-fla.csv" --plot "$out/prefill-vs-fla.png" > "$logs/fla-speed.txt" 2>&1
  say "FLA speed exit $? ($SECONDS s):"; tail -8 "$logs/fla-speed.txt" >> "$sum"
else say "FLA: pip install failed: $(tail -2 "$logs/pip.txt")"; fi
timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/ncu.txt" 2>&1
say "ncu exit $?: $(grep -E '^  gdn|duration' "$logs/ncu.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s %s; ", name, $(NF-1), $NF}') ($SECONDS s)"
timeout 170 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill_prepare_mma_k128 -c 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --import-source no -o "$logs/prepare" .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/prepare-run.txt" 2>&1
say "prepare ncu exit $? ($SECONDS s)"
ncu --import "$logs/prepare.ncu-rep" > "$out/prepare-details.txt" 2>&1
ncu --import "$logs/prepare.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/prepare-source.csv.gz"
say "prepare: $(grep -E 'Duration|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput|Memory Throughput' "$out/prepare-details.txt" | tr -s ' ' | tr '\n' ';')"
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
