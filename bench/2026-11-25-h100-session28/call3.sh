#!/usr/bin/env bash
# Session 28, call 3: KV row 35 (the 2-bit path as its own kernel, launched as the grid path's
# programmatic dependent) through `tools/gpu-check.sh kv-encode` (.carry/deltakv), beside row 33
# (eac5099) as -base; ncu over both encode launches.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
