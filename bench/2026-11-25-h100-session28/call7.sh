#!/bin/bash
# Session 28, call 7: the submitted code (KV row 39; host launches in kv/encode.rs), built by
# `tools/gpu-check.sh build-prefill`, through session 26's final check (its call8.sh:
# `tools/gpu-check.sh kv-encode`, which also times .carry/deltakv-base, here the session's
# starting build 1d5ff6d; then the attention beside torch SDPA, the demo, the kernel compile
# test on the device and the prefill suite).
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
exec bash "$(dirname "$0")/../2026-11-25-h100-session26/call8.sh"
