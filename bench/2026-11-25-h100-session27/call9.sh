#!/usr/bin/env bash
# Session 27, call 9: KV row 31 (each element's lookup waits for an earlier one's, so the lookups
# spread through the arithmetic) through `tools/gpu-check.sh kv-encode`: distance 16 / 32 / 64 as
# .carry/deltakv / -alt / -alt2, row 28's build (289b5a0) as -base, in the same turns.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/deltakv-alt, .carry/deltakv-alt2, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
