#!/usr/bin/env bash
# Session 28, call 2: KV row 34 (2-bit streams' nearest levels in registers at d 128) through
# `tools/gpu-check.sh kv-encode` (.carry/deltakv), beside row 33 (eac5099) as -base.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
