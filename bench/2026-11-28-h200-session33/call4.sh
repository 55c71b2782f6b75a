#!/usr/bin/env bash
# Session 33, call 4 (H200): the chain of a register-resident lead without the copies that row
# 38's kernel spent its time on. ncu's durations of the relay's kernels at B 1, T 16384 with the
# library's lead (0) and the trial leads of gdn_prefill_lead_trial.cu
# (DELTAKV_CUDA_DEFINES=PF_LEAD_TRIAL=n; wrong results on purpose): 1, S^T W^T then the update;
# 2, FlashInfer's form, S^T K^T, then Y M, then the update. 0 again last.
# Carries .carry/deltakv.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for trial in 0 1 2 0; do
    DELTAKV_CUDA_DEFINES=PF_LEAD_TRIAL=$trial timeout 100 ncu --clock-control none \
        -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum \
        .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
        >/tmp/ncu.txt 2>&1
    cat /tmp/ncu.txt >>"$out/ncu-lead.txt"
    echo "lead trial $trial (at ${SECONDS}s):"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    grep -m2 -iE 'error|panicked' /tmp/ncu.txt
done | tee "$out/lead-trials.txt"
gzip -f "$out/ncu-lead.txt"
echo "done at ${SECONDS}s"
