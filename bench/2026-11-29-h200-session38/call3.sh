#!/usr/bin/env bash
# Session 38, calls 3 and 4 (H200; call 3 with the lab as first built, whose pass 2 launch predated
# the library's per-split merge weights and failed at its d 256 check; call 4 with the launch as
# the library makes it): the KV lab (tools/kv-lab, built here by nvcc 13.0.88 from main's
# kernels plus the lab's `v3 level lookups only` variant; carried as .carry/kv_lab): every
# attention variant at B 8 x 32k and B 1 x 128k beside the copy and read ceilings measured in
# the same run, each checked against the lab's f64 reference where it computes attention.
set -u
. tools/device-call.sh
device_header
timeout 200 .carry/kv_lab all 2>&1 | tee "$out/kv-lab.txt"
echo "lab done at ${SECONDS}s"
# SDPA over a bf16 cache and the library's attention (`deltakv bench kv --device cuda`, main
# 8d3054c's binary) at the same shapes, CUDA graphs on both sides.
timeout 200 python3 -u tools/compare_sdpa.py --deltakv .carry/s38/deltakv \
    --csv "$out/kv-vs-sdpa.csv" 2>&1 | tee "$out/compare-sdpa.txt" | tail -n 12
echo "done at ${SECONDS}s"
