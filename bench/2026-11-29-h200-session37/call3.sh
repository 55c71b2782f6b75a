#!/usr/bin/env bash
# Session 37, call 3 (H200): main's build after the session's host and decode-kernel changes
# (.carry/s37b: release binary `--features cuda,wgpu`, stripped, and test executables): every
# CUDA suite (the decode suite's new replay test among them), memcheck over that replay test,
# the wgpu decode and error-scope suites through NVIDIA's Vulkan driver; then the decode
# kernels' time beside call 1's binary (.carry/s37old, main 495983f built `--features cuda`:
# kernels without the slot-count check), alternating, `bench gdn --device cuda --serving none
# --seq-lens 64 --decode-batches 1,32,256`, three rounds each, and the wgpu decode at B 256 (new binary only); then the prefill's
# serving shapes with the new binary beside FLA (tools/compare_fla_prefill.py --skip-accuracy).
# Carries .carry/s37old, .carry/s37b, .carry/vulkan and .whl; shared steps: tools/device-call.sh.
set -u
. tools/device-call.sh
new="$PWD/.carry/s37b/deltakv"
old="$PWD/.carry/s37old/deltakv"
device_header
install_fla
for t in .carry/s37b/tests/*; do
    [ "$SECONDS" -lt 280 ] || { echo "$(basename "$t") not run: the call's time"; continue; }
    run_suite "$new" "$t"
done | tee "$out/tests-summary.txt"
grep -h "past the pool" /tmp/deltakv-cuda-gdn_decode.log | tee -a "$out/tests-summary.txt"
echo "tests done at ${SECONDS}s"
# The wgpu decode suite (its replay test among them) and the error-scope test through NVIDIA's
# Vulkan driver.
. tools/vulkan-env.sh
for t in .carry/s37b/wgpu-tests/*; do
    run_suite "$new" "$t" 200
done | tee -a "$out/tests-summary.txt"
echo "wgpu tests done at ${SECONDS}s"
timeout 60 compute-sanitizer --tool memcheck .carry/s37b/tests/deltakv-cuda-gdn_decode \
    --test-threads=1 a_replayed >/tmp/memcheck.txt 2>&1
echo "memcheck (replay test) rc $?: $(tail -n 1 /tmp/memcheck.txt)" | tee "$out/sanitizers.txt"
for round in 1 2 3; do
    for which in old new; do
        bin=$old; [ $which = new ] && bin=$new
        echo "== $which round $round" >>"$out/decode-ab.txt"
        "$bin" bench gdn --device cuda --serving none --seq-lens 64 --modes chunk \
            --decode-batches 1,32,256 2>&1 | grep "pool" >>"$out/decode-ab.txt"
    done
done
echo "== wgpu new" >>"$out/decode-ab.txt"
timeout 120 "$new" bench gdn --device wgpu --seq-lens 64 --modes chunk --decode-batches 256 2>&1 \
    | grep -i "pool\|copy" >>"$out/decode-ab.txt"
grep -c pool "$out/decode-ab.txt"
echo "decode A/B done at ${SECONDS}s"
"$new" bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json /tmp/dk.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 150 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/dk.json --deltakv-bin "$new" >"$out/compare-fla.txt" 2>&1
tail -n 7 "$out/compare-fla.txt"
gzip -f "$out/tests.txt"
echo "done at ${SECONDS}s"
