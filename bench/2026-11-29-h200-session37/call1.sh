#!/usr/bin/env bash
# Session 37, call 1 (H200): main 495983f's build as submitted for issue 11 (the release binary
# and test executables of `cargo test --release --features cuda --workspace --no-run`,
# stripped, under .carry/s37): the CUDA prefill suite with its printed errors; `bench gdn --device cuda` beside
# FLA 0.6 (tools/compare_fla_prefill.py: CUDA graphs on both sides) and its accuracy part (f64
# recurrence; drift 4k -> 128k); memcheck and racecheck over the checkpoint tests (default
# outputs walk and the one-stage walk); then the other CUDA suites while the call's time lasts.
# Carries .carry/s37 and .whl (FLA 0.6's wheels).
set -u
out=${OUT:-gpu-check-out}
bin="$PWD/.carry/s37/deltakv"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
run_suite() {
    local t=$1 name
    name=$(basename "$t")
    DELTAKV_BIN="$bin" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    { echo "== $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
}
run_suite .carry/s37/tests/deltakv-cuda-gdn_prefill | tee "$out/tests-summary.txt"
"$bin" bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json /tmp/dk.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/dk.json --deltakv-bin "$bin" --csv "$out/prefill-vs-fla.csv" \
    >"$out/compare-fla.txt" 2>&1
tail -n 8 "$out/compare-fla.txt"
echo "speed done at ${SECONDS}s"
PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-speed \
    --deltakv-json /tmp/dk.json --deltakv-bin "$bin" >"$out/accuracy.txt" 2>&1
tail -n 8 "$out/accuracy.txt"
echo "accuracy done at ${SECONDS}s"
timeout 90 compute-sanitizer --tool memcheck .carry/s37/tests/deltakv-cuda-gdn_prefill_checkpoints \
    --test-threads=1 >/tmp/memcheck.txt 2>&1
echo "memcheck rc $?: $(tail -n 1 /tmp/memcheck.txt)" | tee "$out/sanitizers.txt"
timeout 90 compute-sanitizer --tool racecheck .carry/s37/tests/deltakv-cuda-gdn_prefill_checkpoints \
    --test-threads=1 >/tmp/racecheck.txt 2>&1
echo "racecheck rc $?: $(tail -n 1 /tmp/racecheck.txt)" | tee -a "$out/sanitizers.txt"
echo "sanitizers done at ${SECONDS}s"
for t in .carry/s37/tests/*; do
    case "$t" in *gdn_prefill) continue ;; esac
    [ "$SECONDS" -lt 540 ] || { echo "$(basename "$t") not run: the call's time"; continue; }
    run_suite "$t"
done | tee -a "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "done at ${SECONDS}s"
