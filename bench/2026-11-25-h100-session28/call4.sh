#!/usr/bin/env bash
# Session 28, call 4: KV row 36 (row 35 with the bf16 widening by byte permutes: the 2-bit
# kernel at 167 registers, three blocks per SM) through `tools/gpu-check.sh kv-encode`
# (.carry/deltakv), beside row 33 (eac5099) as -base and row 35 (f97efad) as -alt.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/deltakv-alt, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
