#!/usr/bin/env bash
# Session 36, call 3 (H200): main d28b07c's build (the same binaries as calls 1 and 2) as submitted
# for issue 11: the prefill suite with its printed errors, then `bench gdn --device cuda` beside
# FLA 0.6 (tools/compare_fla_prefill.py: CUDA graphs on both sides) with its accuracy part (f64
# recurrence; drift 4k -> 128k), then the other CUDA suites while the call's time lasts.
# Carries .carry/s36 (release binary `--features cuda,wgpu`, stripped, and test executables) and .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
run_suite() {
    local t=$1 name
    name=$(basename "$t")
    DELTAKV_BIN="$PWD/.carry/s36/deltakv" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    { echo "== $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
}
run_suite .carry/s36/tests/deltakv-cuda-gdn_prefill | tee "$out/tests-summary.txt"
.carry/s36/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 \
    --json /tmp/dk.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/dk.json --deltakv-bin .carry/s36/deltakv --csv "$out/prefill-vs-fla.csv" \
    >"$out/compare-fla.txt" 2>&1
tail -n 8 "$out/compare-fla.txt"
echo "speed done at ${SECONDS}s"
PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-speed \
    --deltakv-json /tmp/dk.json --deltakv-bin .carry/s36/deltakv >"$out/accuracy.txt" 2>&1
tail -n 8 "$out/accuracy.txt"
echo "accuracy done at ${SECONDS}s"
for t in .carry/s36/tests/*; do
    case "$t" in *gdn_prefill) continue ;; esac
    [ "$SECONDS" -lt 520 ] || { echo "$(basename "$t") not run: the call's time"; continue; }
    run_suite "$t"
done | tee -a "$out/tests-summary.txt"
echo "done at ${SECONDS}s"
