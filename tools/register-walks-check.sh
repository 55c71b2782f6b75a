#!/usr/bin/env bash
# The register walks (branch register-lead: gdn_prefill_lead_regs.cu; not yet run on a GPU):
# the CUDA prefill suite and the streams test with DELTAKV_PREFILL_LEAD=registers (every
# relayed case at K = 128 takes that lead), with DELTAKV_PREFILL_STATE=registers (every K = 128
# case takes the register outputs walk), both, and neither; compute-sanitizer memcheck over the
# streams test with both; then ncu's durations of the relay's kernels at B 1, T 16384 and
# `bench gdn` for each. Carries .carry/deltakv and the test executables in .carry/s34
# (deltakv-cuda-gdn_prefill, deltakv-cuda-gdn_prefill_streams, deltakv-cuda-gdn_prefill_checkpoints).
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
variants="registers:lockstep lockstep:registers registers:registers default:default"
run_variant() {
    local lead=${1%%:*} state=${1##*:}
    shift
    if [ "$lead" = default ]; then unset DELTAKV_PREFILL_LEAD; else export DELTAKV_PREFILL_LEAD=$lead; fi
    if [ "$state" = default ]; then unset DELTAKV_PREFILL_STATE; else export DELTAKV_PREFILL_STATE=$state; fi
    "$@"
}
for variant in $variants; do
    for t in .carry/s34/*; do
        name=$(basename "$t")
        run_variant "$variant" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
        echo "lead:state $variant $name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)"
        { echo "== $variant $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
    done
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
run_variant registers:registers timeout 200 compute-sanitizer --tool memcheck \
    .carry/s34/deltakv-cuda-gdn_prefill_streams --test-threads=1 >"$out/memcheck.txt" 2>&1
tail -n 3 "$out/memcheck.txt"
for variant in default:default registers:lockstep registers:registers; do
    run_variant "$variant" timeout 100 ncu --clock-control none -k regex:gdn_prefill -c 4 \
        --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "lead:state $variant:"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    run_variant "$variant" timeout 80 .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 2>&1 | grep -E 'T=(16384|65536|8192|4096) '
done | tee "$out/timing.txt"
echo "done at ${SECONDS}s"
