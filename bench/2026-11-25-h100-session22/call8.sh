#!/bin/bash
# Session 22, call 8: the plan's knobs on the submission's binary (.carry/deltakv), no build:
# `bench gdn` with the default plan, the relay off (short prompts walk whole), and the TP-8
# shard's scan with segments of 64 and 256 chunks (8 segments of 128 by default).
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1; shift
  env "$@" timeout 150 .carry/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6,$7,$8}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
b warm
b default1; b relay-off DELTAKV_PREFILL_RELAY=off; b seg64 DELTAKV_PREFILL_SEGMENT_CHUNKS=64
b seg256 DELTAKV_PREFILL_SEGMENT_CHUNKS=256; b default2; b relay-off2 DELTAKV_PREFILL_RELAY=off
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
