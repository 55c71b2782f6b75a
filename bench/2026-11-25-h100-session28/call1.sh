#!/usr/bin/env bash
# Session 28, call 1: KV row 33 (the lag through the scale, the staged vector read back by XOR,
# the signs of 16-bit inputs one word per element pair) through `tools/gpu-check.sh kv-encode`
# (.carry/deltakv), beside main (1d5ff6d) as -base and two timing-only builds: -alt (u formed
# with one multiply, wrong codes) and -alt2 (row 33 at a lag of 24).
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/deltakv-alt, .carry/deltakv-alt2, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
