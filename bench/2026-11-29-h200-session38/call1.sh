#!/usr/bin/env bash
# Session 38, call 1 (H200): main 8d3054c's build, the head submitted for issue 11 at the end of
# session 37 (.carry/s38: the release binary and test executables of `cargo test --release
# --features cuda,wgpu --workspace --no-run`, stripped): the CUDA prefill suite with its printed
# errors; `bench gdn --device cuda` beside FLA 0.6 (tools/compare_fla_prefill.py: CUDA graphs on
# both sides) and its accuracy part (f64 recurrence; drift 4k -> 128k); memcheck and racecheck
# over the checkpoint tests. Carries .carry/s38 and .whl (FLA 0.6's wheels); shared steps:
# tools/device-call.sh.
set -u
. tools/device-call.sh
bin="$PWD/.carry/s38/deltakv"
device_header
install_fla
run_suite "$bin" .carry/s38/tests/deltakv-cuda-gdn_prefill 200 | tee "$out/tests-summary.txt"
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
for tool in memcheck racecheck; do
    [ "$SECONDS" -lt 480 ] || { echo "$tool not run: the call's time"; continue; }
    timeout 90 compute-sanitizer --tool "$tool" .carry/s38/tests/deltakv-cuda-gdn_prefill_checkpoints \
        --test-threads=1 >"/tmp/$tool.txt" 2>&1
    echo "$tool rc $?: $(tail -n 1 "/tmp/$tool.txt")"
done | tee "$out/sanitizers.txt"
gzip -f "$out/tests.txt"
echo "done at ${SECONDS}s"
