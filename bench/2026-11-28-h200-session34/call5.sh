#!/usr/bin/env bash
# Session 34, call 5: the scan's combine with M's tiles double-buffered by cp.async and each
# thread's products over 16-byte rows of M (it took 242.53 us at TP-8 in call 4). The CUDA
# prefill suites (their scan cases at K = 64, 128, 256 run the combine) and the pooled prefill;
# `bench gdn` at the serving shapes; TP-8 beside FLA 0.6 (tools/compare_fla_prefill.py, CUDA
# graphs on both sides; the other serving shapes do not run the scan); ncu's per-kernel
# durations at TP-8; racecheck over the checkpoint tests last. Carries .carry/deltakv,
# .carry/s34 and .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
summary="$out/tests-summary.txt"
for t in .carry/s34/*; do
    name=$(basename "$t")
    timeout 120 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)" >>"$summary"
    { echo "== $name"; cat "/tmp/$name.log"; } >>/tmp/tests.txt
done
gzip -c /tmp/tests.txt >"$out/tests.txt.gz"
cat "$summary"
echo "tests done at ${SECONDS}s"
timeout 60 .carry/deltakv bench gdn --device cuda --seq-lens 64 --decode-batches 1 2>&1 |
    grep -E 'T=(16384|65536|8192|4096) ' >"$out/bench.txt"
cat "$out/bench.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
.carry/deltakv bench gdn --device cuda --serving tp8 --seq-lens 64 --decode-batches 1 \
    --json /tmp/dk.json >/dev/null 2>&1
PYTHONPATH=/tmp/fla-site timeout 90 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/dk.json --deltakv-bin .carry/deltakv --csv "$out/tp8-vs-fla.csv" \
    >/tmp/fla.txt 2>&1
tail -n 4 /tmp/fla.txt >"$out/tp8-vs-fla.txt"; cat "$out/tp8-vs-fla.txt"
echo "fla done at ${SECONDS}s"
timeout 60 ncu --clock-control none -k regex:gdn_prefill -c 5 \
    --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda \
    --serving tp8 --seq-lens 64 --decode-batches 1 >/tmp/ncu.txt 2>&1
grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt |
    awk '/^  gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}' >"$out/ncu.txt"
cat "$out/ncu.txt"
echo "timing done at ${SECONDS}s"
timeout 110 compute-sanitizer --tool racecheck .carry/s34/deltakv-cuda-gdn_prefill_checkpoints \
    --test-threads=1 >/tmp/racecheck.txt 2>&1
tail -n 2 /tmp/racecheck.txt >"$out/racecheck-tail.txt"; cat "$out/racecheck-tail.txt"
echo "done at ${SECONDS}s"
