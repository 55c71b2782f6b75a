#!/usr/bin/env bash
# Session 30, call 4: the CUDA prefill's launch settings at B 1 x T 4096 and T 16384 (Qwen3-Next
# heads, the relay's regime) and B 8 x T 8192: `bench gdn --device cuda --seq-lens 4096,8192,16384`
# with the defaults, one value head per prepare block (DELTAKV_PREFILL_PREPARE_GROUP=1), and the
# relay's first-segment share at 0.6, 0.65, 0.75 and 0.8 (default 0.7), the defaults again last.
# Carries .carry/deltakv (main's build).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for setting in default DELTAKV_PREFILL_PREPARE_GROUP=1 DELTAKV_PREFILL_RELAY=0.6 \
    DELTAKV_PREFILL_RELAY=0.65 DELTAKV_PREFILL_RELAY=0.75 DELTAKV_PREFILL_RELAY=0.8 default; do
    echo "== $setting" >>"$out/bench.txt"
    env "$([ "$setting" = default ] && echo DELTAKV_NOTHING=1 || echo "$setting")" \
        .carry/deltakv bench gdn --device cuda --seq-lens 4096,8192,16384 --decode-batches 1 \
        >"$out/run.txt" 2>&1
    cat "$out/run.txt" >>"$out/bench.txt"
    echo "$setting: $(grep -h 'T=4096 \|T=16384\|B=8' "$out/run.txt" | awk '{print $2, $3, $6, $7}' | tr '\n' ';')"
done
rm -f "$out/run.txt"
echo "done at ${SECONDS}s"
