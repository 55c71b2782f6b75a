#!/usr/bin/env bash
# Session 33, call 5 (H200): the outputs walk on one warpgroup with the state in registers in
# FlashInfer's form (gdn_prefill_lead_trial.cu, PF_LEAD_TRIAL=3: O^T = S^T Q^T beside
# X^T = S^T K^T, Y M, O^T += V'^T C beside the update; B operands from unfilled buffers, wrong
# results on purpose) in place of the lockstep outputs walk (DELTAKV_PREFILL_STATE=lockstep, whose
# launch it takes), the lead in the same form. ncu's durations of the relay's kernels at B 1,
# T 16384: the default build (overlapped walk), the lockstep build, trial 3, the lockstep build
# again; then `bench gdn` with trial 3 (the call's time with both walks replaced).
# Carries .carry/deltakv.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for run in default:0 lockstep:0 lockstep:3 lockstep:0; do
    pass=${run%%:*} trial=${run##*:}
    if [ $pass = lockstep ]; then export DELTAKV_PREFILL_STATE=lockstep; else unset DELTAKV_PREFILL_STATE; fi
    DELTAKV_CUDA_DEFINES=PF_LEAD_TRIAL=$trial timeout 100 ncu --clock-control none \
        -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum \
        .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
        >/tmp/ncu.txt 2>&1
    cat /tmp/ncu.txt >>"$out/ncu-outputs.txt"
    echo "pass $pass trial $trial (at ${SECONDS}s):"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    grep -m2 -iE 'error|panicked' /tmp/ncu.txt
done | tee "$out/outputs-trials.txt"
gzip -f "$out/ncu-outputs.txt"
for run in 0 3; do
    echo "== bench lockstep trial $run"
    DELTAKV_PREFILL_STATE=lockstep DELTAKV_CUDA_DEFINES=PF_LEAD_TRIAL=$run timeout 80 \
        .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 2>&1 | grep -E 'B=|rror'
done | tee "$out/bench.txt"
echo "done at ${SECONDS}s"
