#!/usr/bin/env bash
# Session 34, call 3: the register walks as the default for K = 128 on sm_90a, the scan's
# transition now in the same form (gdn_prefill_transition_regs_k128). The CUDA prefill suites,
# the pooled prefill and the CLI's device tests by default, the prefill suites with
# DELTAKV_PREFILL_STATE=overlap; memcheck and racecheck over the checkpoints test (scan and
# relay plans); ncu's per-kernel durations of both passes over `bench gdn` (name, grid,
# duration); then `bench gdn` beside FLA 0.6 (tools/compare_fla_prefill.py, CUDA graphs on
# both sides) and the accuracy part (f64 recurrence; drift 4k -> 128k).
# Carries .carry/deltakv, .carry/s34, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
for state in default overlap; do
    for t in .carry/s34/*; do
        name=$(basename "$t")
        if [ "$state" = overlap ]; then
            case "$name" in *cuda-gdn_prefill*) ;; *) continue ;; esac
            run="env DELTAKV_PREFILL_STATE=overlap"
        else
            run="env -u DELTAKV_PREFILL_STATE"
        fi
        DELTAKV_BIN="$PWD/.carry/deltakv" $run timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
        echo "$state $name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)"
        { echo "== $state $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
    done
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool \
        .carry/s34/deltakv-cuda-gdn_prefill_checkpoints --test-threads=1 >"$out/$tool.txt" 2>&1
    echo "$tool: $(tail -n 1 "$out/$tool.txt")"
done
echo "tests done at ${SECONDS}s"
for state in default overlap; do
    if [ "$state" = default ]; then run="env -u DELTAKV_PREFILL_STATE"; else run="env DELTAKV_PREFILL_STATE=overlap"; fi
    $run timeout 150 ncu --clock-control none -k regex:gdn_prefill -c 60 \
        --metrics gpu__time_duration.sum,launch__grid_size .carry/deltakv bench gdn --device cuda \
        --seq-lens 16384 --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "state $state:"
    grep -E '^  gdn_prefill|gpu__time_duration|launch__grid_size' /tmp/ncu.txt |
        awk '/^  gdn_prefill/{k=$1} /launch__grid_size/{g=$NF} /gpu__time/{print "  " k, "grid", g, $(NF-1), $NF}' | uniq -c
    $run timeout 80 .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 2>&1 | grep -E 'T=(16384|65536|8192|4096) '
done | tee "$out/timing.txt"
echo "ncu done at ${SECONDS}s"
.carry/deltakv bench gdn --device cuda --seq-lens 1024,4096,16384,65536 --decode-batches 1 \
    --json /tmp/deltakv-prefill.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 200 python3 tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv \
    --csv "$out/prefill-vs-fla.csv" --plot "$out/prefill-vs-fla.png" >"$out/compare-fla.txt" 2>&1
tail -n 12 "$out/compare-fla.txt"
echo "fla done at ${SECONDS}s"
PYTHONPATH=/tmp/fla-site timeout 200 python3 tools/compare_fla_prefill.py --skip-speed \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv >"$out/accuracy.txt" 2>&1
tail -n 14 "$out/accuracy.txt"
echo "done at ${SECONDS}s"
