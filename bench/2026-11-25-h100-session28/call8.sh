#!/usr/bin/env bash
# Session 28, call 8: the review's mends (the 2-bit kernel without the grid's unused shared
# cells and with its constants loaded only there; `griddepcontrol.launch_dependents` only in the
# d 128 grid kernel; the sign words formed once per cache; the dependent launch reusing the first
# launch's grid) through `tools/gpu-check.sh kv-encode` (.carry/deltakv), beside d98ab60 as -base.
# Carry: .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
OUT=${OUT:-gpu-check-out} tools/gpu-check.sh kv-encode
