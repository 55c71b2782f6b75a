#!/usr/bin/env bash
# Session 38, call 5 (H200): the session's final head (.carry/s38f: the release binary and test
# executables of `cargo test --release --features cuda,wgpu --workspace --no-run`, stripped;
# its CUDA kernels are 8d3054c's, its host code adds the switches read by the contract's
# readers and the prepared prefill call in its own file): the CUDA prefill suite, `bench gdn
# --device cuda` beside FLA 0.6 (speed part of tools/compare_fla_prefill.py), memcheck and
# racecheck over the checkpoint tests, every other CUDA suite, then through NVIDIA's Vulkan
# driver the wgpu suites whose code changed (the prefill's early plan check: checkpoints,
# fallbacks; the coop suite with DELTAKV_WGPU_COOP=1; the exit hook in each). Carries
# .carry/s38f, .carry/vulkan and .whl; shared steps: tools/device-call.sh.
set -u
. tools/device-call.sh
bin="$PWD/.carry/s38f/deltakv"
device_header
install_fla
run_suite "$bin" .carry/s38f/tests/deltakv-cuda-gdn_prefill 200 | tee "$out/tests-summary.txt"
"$bin" bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json /tmp/dk.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/dk.json --deltakv-bin "$bin" --csv "$out/prefill-vs-fla.csv" \
    >"$out/compare-fla.txt" 2>&1
tail -n 8 "$out/compare-fla.txt"
echo "speed done at ${SECONDS}s"
for tool in memcheck racecheck; do
    timeout 90 compute-sanitizer --tool "$tool" .carry/s38f/tests/deltakv-cuda-gdn_prefill_checkpoints \
        --test-threads=1 >"/tmp/$tool.txt" 2>&1
    echo "$tool rc $?: $(tail -n 1 "/tmp/$tool.txt")"
done | tee "$out/sanitizers.txt"
for t in .carry/s38f/tests/*; do
    case "$t" in *gdn_prefill) continue ;; esac
    [ "$SECONDS" -lt 440 ] || { echo "$(basename "$t") not run: the call's time"; continue; }
    run_suite "$bin" "$t"
done | tee -a "$out/tests-summary.txt"
echo "cuda suites done at ${SECONDS}s"
. tools/vulkan-env.sh
for t in .carry/s38f/wgpu-tests/*; do
    [ "$SECONDS" -lt 520 ] || { echo "$(basename "$t") not run: the call's time"; continue; }
    case "$t" in *coop_matrix) export DELTAKV_WGPU_COOP=1 ;; *) unset DELTAKV_WGPU_COOP ;; esac
    run_suite "$bin" "$t" 70
done | tee -a "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "done at ${SECONDS}s"
