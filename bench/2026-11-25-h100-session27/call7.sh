#!/usr/bin/env bash
# Session 27, call 7: KV row 30 (row 29's kernel in 256-thread blocks, one per SM, at d 128)
# through `tools/gpu-check.sh kv-encode`: block caps per stream 1 / 4 / 64 per SM as
# .carry/deltakv / -alt / -alt2 (cache.rs's BLOCK_CAP edited per build), row 28's build as
# -base (289b5a0), in the same turns.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/deltakv-alt, .carry/deltakv-alt2, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
