#!/usr/bin/env bash
# Session 35, call 4: d11869c's kernels again (the deferred prepare reverted). Where the
# register walks' prepare spends its time at T 16384: ncu's duration of the prepare with each
# PF_TRIAL part left out (wrong results on purpose: 1 the scores' stores, 2 the inverse, 16 the
# fused l2 norm, 32 K K^T, Q K^T and the masked stores of A and the scores), its SASS source
# counters (per-instruction executed counts and stall samples), and every kernel's duration at
# B 8 (`--serving b8`). Carries .carry/deltakv.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt"
for trial in 0 1 2 16 32 0; do
    DELTAKV_CUDA_DEFINES=PF_TRIAL=$trial timeout 60 ncu --clock-control none -k regex:gdn_prefill_prepare -c 2 \
        --metrics gpu__time_duration.sum,smsp__inst_executed.sum .carry/deltakv bench gdn --device cuda \
        --serving t16384 --seq-lens 64 --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "trial $trial: $(grep -E 'gpu__time_duration|smsp__inst_executed' /tmp/ncu.txt | awk '{print $(NF-1), $NF}' | tr '\n' ' ')"
done >"$out/trials.txt"
cat "$out/trials.txt"
echo "trials done at ${SECONDS}s"
timeout 60 ncu --clock-control none -k regex:gdn_prefill -c 8 --metrics gpu__time_duration.sum \
    .carry/deltakv bench gdn --device cuda --serving b8 --seq-lens 64 --decode-batches 1 >/tmp/ncu-b8.txt 2>&1
grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu-b8.txt |
    awk '/^  gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}' >"$out/ncu-b8.txt"
cat "$out/ncu-b8.txt"
echo "b8 done at ${SECONDS}s"
timeout 150 ncu --set full --import-source no -k regex:gdn_prefill_prepare -c 1 -o /tmp/prep \
    .carry/deltakv bench gdn --device cuda --serving t16384 --seq-lens 64 --decode-batches 1 >/tmp/ncu-full.txt 2>&1
tail -n 3 /tmp/ncu-full.txt
ncu -i /tmp/prep.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip >"$out/prepare-sass.csv.gz"
ncu -i /tmp/prep.ncu-rep --page details 2>/dev/null >"$out/prepare-details.txt"
ls -la "$out"
echo "done at ${SECONDS}s"
