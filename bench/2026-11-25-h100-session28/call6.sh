#!/usr/bin/env bash
# Session 28, call 6: KV row 38 (one waiting block in the 2-bit launch) through
# `tools/gpu-check.sh kv-encode` (.carry/deltakv), beside row 37 (8c45541) as -base and row 38
# with the 2-bit kernel unlagged at three blocks as -alt.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/deltakv-alt, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
