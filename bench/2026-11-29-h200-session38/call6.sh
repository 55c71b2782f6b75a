#!/usr/bin/env bash
# Session 38, call 6 (H200): the same build as call 5 (.carry/s38f), on the warm machine: the
# CUDA suites call 5's time left out (checkpoints, streams, paged KV, device tensors, pooled
# prefill). Shared steps: tools/device-call.sh.
set -u
. tools/device-call.sh
bin="$PWD/.carry/s38f/deltakv"
device_header
for name in deltakv-cuda-gdn_prefill_checkpoints deltakv-cuda-gdn_prefill_streams \
    deltakv-cuda-kv_paged deltakv-device_tensor deltakv-prefill_pool; do
    run_suite "$bin" ".carry/s38f/tests/$name" 90
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "done at ${SECONDS}s"
