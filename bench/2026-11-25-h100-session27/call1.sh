#!/usr/bin/env bash
# Session 27, call 1: KV row 26 (the grid cell in two fmas, the code packed by one predicated
# add) through `tools/gpu-check.sh kv-encode`, beside main's build (.carry/deltakv-base, 2d3af19)
# in the same turns. Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
