#!/usr/bin/env bash
# Session 27, call 4: the session's encode (row 28's __ldg form) as the submitted build, through
# session 26's final check (bench/2026-11-25-h100-session26/call8.sh: `tools/gpu-check.sh
# kv-encode` with main's 2d3af19 build carried as .carry/deltakv-base, then the attention beside
# torch SDPA, the demo, the kernel compile test on the device and the prefill suite).
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
bash "$(dirname "$0")/../2026-11-25-h100-session26/call8.sh"
