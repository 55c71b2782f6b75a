#!/usr/bin/env bash
# The register lead (branch register-lead, gdn_prefill_lead_regs.cu; not yet run on a GPU):
# the CUDA prefill suite and the streams test with DELTAKV_PREFILL_LEAD=registers (every relayed
# case at K = 128 takes it: the suite's Split::Relay(1 / 2 / 9) and the automatic relay), under
# compute-sanitizer memcheck for the relayed streams test, then ncu's durations of the relay's
# kernels at B 1, T 16384 and `bench gdn` with each lead. Carries .carry/deltakv and the test
# executables in .carry/s34 (deltakv-cuda-gdn_prefill, deltakv-cuda-gdn_prefill_streams).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for lead in registers lockstep; do
    for t in .carry/s34/*; do
        name=$(basename "$t")
        DELTAKV_PREFILL_LEAD=$lead timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name-$lead.log" 2>&1
        echo "$lead $name rc $?: $(grep -h 'test result' "/tmp/$name-$lead.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name-$lead.log" | head -n 3)"
        cat "/tmp/$name-$lead.log" >>"$out/tests.txt"
    done
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
DELTAKV_PREFILL_LEAD=registers timeout 200 compute-sanitizer --tool memcheck \
    .carry/s34/deltakv-cuda-gdn_prefill_streams --test-threads=1 >"$out/memcheck.txt" 2>&1
tail -n 3 "$out/memcheck.txt"
for lead in lockstep registers; do
    DELTAKV_PREFILL_LEAD=$lead timeout 100 ncu --clock-control none -k regex:gdn_prefill -c 4 \
        --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "lead $lead:"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    DELTAKV_PREFILL_LEAD=$lead timeout 80 .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 2>&1 | grep -E 'T=(16384|65536|8192|4096) '
done | tee "$out/timing.txt"
echo "done at ${SECONDS}s"
