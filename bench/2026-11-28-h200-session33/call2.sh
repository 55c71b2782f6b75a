#!/usr/bin/env bash
# Session 33, call 2 (H200): what each part of the prefill's prepare kernel costs at full
# occupancy. The prepare compiled with DELTAKV_CUDA_DEFINES=PF_TRIAL=n (timing trials: each bit
# leaves one part out, wrong results on purpose; gdn_prefill_prepare.cu lists them), ncu's
# duration of its first three launches in `bench gdn --device cuda` (B 1, T 16384, Qwen3-Next
# heads), the library's build (0) first and last.
# Carries .carry/deltakv.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for trial in 0 1 2 4 8 16 32 5 0; do
    DELTAKV_CUDA_DEFINES=PF_TRIAL=$trial timeout 100 ncu --clock-control none \
        -k regex:gdn_prefill_prepare -c 3 --metrics gpu__time_duration.sum \
        .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
        >"$out/ncu-trial$trial.txt" 2>&1
    echo "trial $trial: $(grep -h 'gpu__time_duration.sum' "$out/ncu-trial$trial.txt" | awk '{print $(NF-1)":"$NF}' | paste -sd' ') us (at ${SECONDS}s)"
done | tee "$out/trials.txt"
echo "done at ${SECONDS}s"
