#!/usr/bin/env bash
# Session 27, call 10: KV row 32 (the Hadamard signs carried through the butterflies) through
# `tools/gpu-check.sh kv-encode`, beside row 31's build (.carry/deltakv-base, ca3e9a1) in the
# same turns. Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
