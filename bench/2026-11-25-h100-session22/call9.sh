#!/bin/bash
# Session 22, call 9: where splitting a short prompt stops paying (the submission's binary,
# .carry/deltakv, no build): `bench gdn --seq-lens 1024,...,3072` with the default plan (the
# relay at these lengths) and with every sequence walked whole (DELTAKV_PREFILL_SEGMENT_CHUNKS
# larger than any sequence), twice each.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1; shift
  env "$@" timeout 150 .carry/deltakv bench gdn --device cuda --seq-lens 1024,1536,2048,2560,3072 --decode-batches 1 > "$logs/bench-$name.txt" 2>&1
  say "$name exit $?: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6,$7,$10}' | tr '\n' ';') $(grep -i error "$logs/bench-$name.txt" | head -2)"
}
b warm
b default1; b whole1 DELTAKV_PREFILL_SEGMENT_CHUNKS=1000000; b default2; b whole2 DELTAKV_PREFILL_SEGMENT_CHUNKS=1000000
say "done ($SECONDS s)"
tar -czf "$out/logs.tar.gz" -C "$logs" .
