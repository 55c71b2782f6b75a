#!/usr/bin/env bash
# Session 28, call 5: KV row 37 (the bf16 grid kernel at three blocks per SM, lag 48) through
# `tools/gpu-check.sh kv-encode` (.carry/deltakv), beside row 36 (e0319cb) as -base.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
