#!/usr/bin/env bash
# Session 32, call 6 (H200): where the relay starts paying on this GPU (`RELAY_MIN_CHUNKS` = 40
# chunks, set on the H100): `bench gdn --device cuda` at T 1536 to 4096 with the default plan
# and with DELTAKV_PREFILL_RELAY=off (every sequence walked whole), each twice, alternating.
# Carries .carry/deltakv (fe4f694's build).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
lens=1536,2048,2560,3072,3584,4096
for run in 1 2; do
    for relay in default off; do
        echo "== run $run relay $relay"
        if [ $relay = default ]; then
            timeout 80 .carry/deltakv bench gdn --device cuda --seq-lens $lens --decode-batches 1
        else
            DELTAKV_PREFILL_RELAY=off timeout 80 .carry/deltakv bench gdn --device cuda \
                --seq-lens $lens --decode-batches 1
        fi
        echo "at ${SECONDS}s"
    done
done >"$out/relay-min.txt" 2>&1
grep -E '^==|B=1  T=(1536|2048|2560|3072|3584|4096) ' "$out/relay-min.txt" | head -n 40
echo "done at ${SECONDS}s"
