#!/usr/bin/env bash
# Session 36, calls 1 and 2 (H200): main d28b07c's build (kernel log rows 61-62): the prepare's
# pair form and the one-stage outputs walk, each against its switch in one binary.
# Carries .carry/b8 (the release binary built with `--features cuda,wgpu` as .carry/b8/deltakv,
# the CUDA prefill, checkpoint and stream tests, the pooled prefill and the CLI's device tests of
# the same source in .carry/b8/tests), and .whl for FLA.
# Two calls, each under the 600 s limit:
#   calls1-2.sh tests  (call 1)    every CUDA prefill suite with each form, racecheck and memcheck
#                               over the checkpoint tests with both new forms
#   calls1-2.sh timing (call 2)   ncu's prepare and outputs-walk durations at B 8, `bench gdn` at
#                               the four serving shapes in all four combinations, alternating,
#                               then FLA beside the default
set -u
mode=${1:-tests}
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt"
if [ "$mode" = tests ]; then
forms=("" "DELTAKV_PREFILL_PREPARE_PAIR=off" "DELTAKV_PREFILL_OUTPUT_STAGES=1" "DELTAKV_PREFILL_OUTPUT_STAGES=2")
for form in "${forms[@]}"; do
    for t in .carry/b8/tests/*; do
        name=$(basename "$t")
        case "$name" in *gdn_prefill*|*prefill_pool*) ;; *) [ -z "$form" ] || continue ;; esac
        env $form DELTAKV_BIN="$PWD/.carry/b8/deltakv" timeout 150 "$t" --test-threads=1 >"/tmp/$name.log" 2>&1
        echo "[${form:-default}] $name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)"
    done
done | tee "$out/tests-summary.txt"
echo "tests done at ${SECONDS}s"
for tool in racecheck memcheck; do
    DELTAKV_PREFILL_OUTPUT_STAGES=1 timeout 100 compute-sanitizer --tool $tool \
        .carry/b8/tests/deltakv-cuda-gdn_prefill_checkpoints --test-threads=1 >/tmp/$tool.txt 2>&1
    echo "$tool rc $?: $(tail -n 1 /tmp/$tool.txt)"
done | tee "$out/sanitizers.txt"
exit 0
fi
for form in "" "DELTAKV_PREFILL_PREPARE_PAIR=off DELTAKV_PREFILL_OUTPUT_STAGES=2"; do
    env $form timeout 60 ncu --clock-control none -k regex:gdn_prefill -c 4 --metrics gpu__time_duration.sum \
        .carry/b8/deltakv bench gdn --device cuda --serving b8 --seq-lens 64 --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "[${form:-default}]"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/^  gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
done | tee "$out/ncu.txt"
for round in 1 2; do
    for form in "" "DELTAKV_PREFILL_PREPARE_PAIR=off" "DELTAKV_PREFILL_OUTPUT_STAGES=2" \
        "DELTAKV_PREFILL_PREPARE_PAIR=off DELTAKV_PREFILL_OUTPUT_STAGES=2"; do
        echo "[${form:-default}]"
        env $form timeout 60 .carry/b8/deltakv bench gdn --device cuda --serving t16384,tp8,b8,t4096 \
            --seq-lens 1024 --decode-batches 1 2>&1 | grep -E 'T=[0-9]+ '
    done
done | tee "$out/bench.txt"
echo "bench done at ${SECONDS}s"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
.carry/b8/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json /tmp/dk.json >/dev/null 2>&1
PYTHONPATH=/tmp/fla-site timeout 170 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/dk.json --deltakv-bin .carry/b8/deltakv >/tmp/fla.txt 2>&1
tail -n 8 /tmp/fla.txt | tee "$out/compare-fla.txt"
echo "done at ${SECONDS}s"
