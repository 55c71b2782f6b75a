#!/usr/bin/env bash
# Session 33, call 6 (H200): the final source. The CUDA prefill suite and the streams test
# (the state module's entry points now declared one by one, the trial file compiled to nothing
# by default); then the trial walks after their pieces were shared between the lead and the
# outputs walk: ncu's durations of the relay's kernels at B 1, T 16384 for the default build,
# PF_LEAD_TRIAL=2 (the lead in FlashInfer's form) and PF_LEAD_TRIAL=3 under
# DELTAKV_PREFILL_STATE=lockstep (that lead and the outputs walk in the same form).
# Carries .carry/deltakv, .carry/s33.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in .carry/s33/*; do
    name=$(basename "$t")
    timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    echo "== $name" >>"$out/tests.txt"; cat "/tmp/$name.log" >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
for run in default:0 default:2 lockstep:3; do
    pass=${run%%:*} trial=${run##*:}
    if [ $pass = lockstep ]; then export DELTAKV_PREFILL_STATE=lockstep; else unset DELTAKV_PREFILL_STATE; fi
    DELTAKV_CUDA_DEFINES=PF_LEAD_TRIAL=$trial timeout 100 ncu --clock-control none \
        -k regex:gdn_prefill -c 4 --metrics gpu__time_duration.sum \
        .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 \
        >/tmp/ncu.txt 2>&1
    cat /tmp/ncu.txt >>"$out/ncu-final.txt"
    echo "pass $pass trial $trial (at ${SECONDS}s):"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    grep -m2 -iE 'error|panicked' /tmp/ncu.txt
done | tee "$out/trials.txt"
gzip -f "$out/ncu-final.txt"
echo "done at ${SECONDS}s"
