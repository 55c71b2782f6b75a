#!/usr/bin/env bash
# Session 37, call 4 (H200, the machine call 3 left warm; the same .carry/s37b build): the two
# suites call 3's time left out (device tensors, pooled prefill), then `bench gdn --device cuda`
# at the serving shapes beside FLA 0.6 (tools/compare_fla_prefill.py --skip-accuracy), which
# call 3's time cut off. Carries .carry/s37b and .whl; shared steps: tools/device-call.sh.
set -u
. tools/device-call.sh
new="$PWD/.carry/s37b/deltakv"
install_fla
for t in .carry/s37b/tests/deltakv-device_tensor .carry/s37b/tests/deltakv-prefill_pool; do
    run_suite "$new" "$t"
done | tee "$out/tests-summary.txt"
"$new" bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json /tmp/dk.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/dk.json --deltakv-bin "$new" >"$out/compare-fla.txt" 2>&1
tail -n 7 "$out/compare-fla.txt"
echo "done at ${SECONDS}s"
