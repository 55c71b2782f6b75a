#!/bin/bash
# Session 22, call 2: where call 1's cost comes from. The working tree's binary (row 37 with
# the prepare's publish by thread 0 only) under DELTAKV_PREFILL_EARLY=on / flags / off against
# main's (.carry/deltakv-base) in the same call, the prefill suite, and ncu's kernel durations
# at T 16384 for main's binary and the new one (on, off).
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 150 .carry/$bin bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
b warm deltakv
timeout 150 .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 --nocapture > "$logs/t-gdn_prefill.log" 2>&1
say "gdn_prefill exit $?: $(grep 'test result' "$logs/t-gdn_prefill.log") worst o $(grep -ho ': o [0-9.e+-]*' "$logs/t-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1) ($SECONDS s)"
for r in 1 2; do
  b base$r deltakv-base; b on$r deltakv; b flags$r deltakv DELTAKV_PREFILL_EARLY=flags; b off$r deltakv DELTAKV_PREFILL_EARLY=off
done
n() { local name=$1 bin=$2; shift 2
  env "$@" timeout 100 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum .carry/$bin bench gdn --device cuda --seq-lens 16384 --decode-batches 1 > "$logs/ncu-$name.txt" 2>&1
  say "ncu $name exit $?: $(grep -E '^  gdn|duration' "$logs/ncu-$name.txt" | awk '/^  gdn/ {name=$1} /duration/ {printf "%s %s %s; ", name, $(NF-1), $NF}')"
}
n base deltakv-base; n on deltakv; n off deltakv DELTAKV_PREFILL_EARLY=off
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
