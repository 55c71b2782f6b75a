#!/usr/bin/env bash
# Session 27, call 6: KV row 29 (the next pass's copies issued while this pass is encoded)
# through `tools/gpu-check.sh kv-encode`: .carry/deltakv with the default block cap (64 per SM),
# .carry/deltakv-alt with 8 per SM, .carry/deltakv-alt2 with 2 per SM (cache.rs's clamp edited
# for those builds only), .carry/deltakv-base row 28's build (289b5a0), in the same turns.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/deltakv-alt, .carry/deltakv-alt2, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
