#!/usr/bin/env bash
# Session 37, call 5 (H200): main c0684ba's build (.carry/s37c: the release binary and CUDA test
# executables of `cargo test --release --features cuda,wgpu --workspace --no-run`, stripped):
# every CUDA suite once more after the switches' one reader and the replay test's shared
# checker, the decode suite first. Carries .carry/s37c; shared steps: tools/device-call.sh.
set -u
. tools/device-call.sh
bin="$PWD/.carry/s37c/deltakv"
device_header
for t in .carry/s37c/tests/deltakv-cuda-gdn_decode .carry/s37c/tests/*; do
    case " ${ran:-} " in *" $t "*) continue ;; esac
    ran="${ran:-} $t"
    [ "$SECONDS" -lt 330 ] || { echo "$(basename "$t") not run: the call's time"; continue; }
    run_suite "$bin" "$t"
done | tee "$out/tests-summary.txt"
grep -h "past the pool" /tmp/deltakv-cuda-gdn_decode.log | tee -a "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
echo "done at ${SECONDS}s"
