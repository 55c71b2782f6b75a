#!/usr/bin/env bash
# The register walks (branch register-lead: gdn_prefill_lead_regs.cu; not yet run on a GPU):
# the CUDA prefill suites (the contract's cases, checkpoints, streams) with
# DELTAKV_PREFILL_STATE=registers (every K = 128 call whose plan does not run the scan takes the
# register outputs walk, the register lead where it relays, and the prepare without W and U)
# and without it; compute-sanitizer memcheck over the streams test with it; then ncu's
# durations of the prefill's kernels at B 1, T 16384 and `bench gdn` for both. Carries
# .carry/deltakv and the test executables in .carry/s34 (deltakv-cuda-gdn_prefill,
# deltakv-cuda-gdn_prefill_checkpoints, deltakv-cuda-gdn_prefill_streams).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
with_state() {
    local state=$1
    shift
    if [ "$state" = default ]; then
        env -u DELTAKV_PREFILL_STATE "$@"
    else
        DELTAKV_PREFILL_STATE=$state "$@"
    fi
}
for state in registers default; do
    for t in .carry/s34/*; do
        name=$(basename "$t")
        with_state "$state" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
        echo "state $state $name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)"
        { echo "== $state $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
    done
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
with_state registers timeout 200 compute-sanitizer --tool memcheck \
    .carry/s34/deltakv-cuda-gdn_prefill_streams --test-threads=1 >"$out/memcheck.txt" 2>&1
tail -n 3 "$out/memcheck.txt"
for state in default registers; do
    with_state "$state" timeout 100 ncu --clock-control none -k regex:gdn_prefill -c 4 \
        --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "state $state:"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    with_state "$state" timeout 80 .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 2>&1 | grep -E 'T=(16384|65536|8192|4096) '
done | tee "$out/timing.txt"
echo "done at ${SECONDS}s"
