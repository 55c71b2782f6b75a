#!/usr/bin/env bash
# Session 27, call 3: KV row 28 (the grid cells by cp.async.ca) through `tools/gpu-check.sh
# kv-encode`, beside row 26's build (.carry/deltakv-base, 5878048) and the __ldg fill
# (.carry/deltakv-alt: row 28 with `cells[i] = __ldg(src + i / 8)` in kv_copy_grid_cells) in
# the same turns. Carry: .carry/deltakv, .carry/deltakv-base, .carry/deltakv-alt, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
