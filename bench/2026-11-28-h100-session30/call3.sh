#!/usr/bin/env bash
# Session 30, call 3: the CUDA prefill's segment length on the TP-8 shard (B 1, T 65536, Hg 2,
# H 8), where the two-level scan runs: `bench gdn --device cuda --seq-lens 65536` with
# DELTAKV_PREFILL_SEGMENT_CHUNKS unset (the plan's choice: 8 segments of 128 chunks) and forced to
# 64, 86, 103, 171 and 256 chunks, the default again last. Carries .carry/deltakv (main's build).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for n in default 64 86 103 171 256 default; do
    echo "== segment chunks $n" >>"$out/bench.txt"
    if [ "$n" = default ]; then
        .carry/deltakv bench gdn --device cuda --seq-lens 65536 --decode-batches 1 >"$out/run.txt" 2>&1
    else
        DELTAKV_PREFILL_SEGMENT_CHUNKS=$n .carry/deltakv bench gdn --device cuda --seq-lens 65536 \
            --decode-batches 1 >"$out/run.txt" 2>&1
    fi
    cat "$out/run.txt" >>"$out/bench.txt"
    echo "$n: $(grep -h 'tp8-shard\|B=1  T=65536' "$out/run.txt" | tr -s ' ' | tr '\n' ';')"
done
rm -f "$out/run.txt"
echo "done at ${SECONDS}s"
