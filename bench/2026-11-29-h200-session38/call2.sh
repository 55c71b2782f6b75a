#!/usr/bin/env bash
# Session 38, call 2 (H200): the same build as call 1 (.carry/s38): every other CUDA suite (the
# decode suite with its replay test, checkpoints, streams, paged KV, the CLI's device tests,
# device tensors, pooled prefill). Shared steps: tools/device-call.sh.
set -u
. tools/device-call.sh
bin="$PWD/.carry/s38/deltakv"
device_header
for t in .carry/s38/tests/*; do
    case "$t" in *gdn_prefill) continue ;; esac
    [ "$SECONDS" -lt 480 ] || { echo "$(basename "$t") not run: the call's time"; continue; }
    run_suite "$bin" "$t"
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "done at ${SECONDS}s"
