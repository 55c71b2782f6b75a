#!/usr/bin/env bash
# Session 35, call 3: 9a629a5, the relay's second segments prepared beside the lead and the
# first segments' walk (DELTAKV_PREFILL_DEFER=off: every chunk first). The CUDA prefill
# suites, the pooled prefill and the CLI's device tests; memcheck over the checkpoint tests
# and racecheck over their odd-lengths case (relay plans included); `bench gdn` at the serving
# shapes and T 1024 / 2048, deferred and not, alternating; then FLA 0.6 beside the default.
# Carries .carry/deltakv, .carry/s35, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt"
summary="$out/tests-summary.txt"
for t in .carry/s35/*; do
    name=$(basename "$t")
    DELTAKV_BIN="$PWD/.carry/deltakv" timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "$name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)" >>"$summary"
    { echo "== $name"; cat "/tmp/$name.log"; } >>/tmp/tests.txt
done
gzip -c /tmp/tests.txt >"$out/tests.txt.gz"
cat "$summary"
echo "tests done at ${SECONDS}s"
for defer in on off on off; do
    echo "defer $defer:"
    DELTAKV_PREFILL_DEFER=$defer timeout 60 .carry/deltakv bench gdn --device cuda \
        --serving t16384,tp8,b8,t4096 --seq-lens 1024,2048 --decode-batches 1 2>&1 | grep -E 'T=[0-9]+ '
done >"$out/bench.txt"
cat "$out/bench.txt"
echo "bench done at ${SECONDS}s"
timeout 120 compute-sanitizer --tool memcheck .carry/s35/deltakv-cuda-gdn_prefill_checkpoints \
    --test-threads=1 >/tmp/memcheck.txt 2>&1
echo "memcheck rc $?: $(tail -n 1 /tmp/memcheck.txt)" >>"$out/sanitizers.txt"
timeout 150 compute-sanitizer --tool racecheck .carry/s35/deltakv-cuda-gdn_prefill_checkpoints \
    checkpoints_at_odd_lengths --test-threads=1 >/tmp/racecheck.txt 2>&1
echo "racecheck rc $?: $(tail -n 1 /tmp/racecheck.txt)" >>"$out/sanitizers.txt"
tail -n 4 /tmp/memcheck.txt /tmp/racecheck.txt >"$out/sanitizer-tails.txt"
cat "$out/sanitizers.txt"
echo "sanitizers done at ${SECONDS}s"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
.carry/deltakv bench gdn --device cuda --seq-lens 1024,4096 --decode-batches 1 \
    --json /tmp/deltakv-prefill.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv \
    --csv /tmp/prefill-vs-fla.csv >/tmp/compare-fla.txt 2>&1
cp /tmp/compare-fla.txt /tmp/prefill-vs-fla.csv "$out/" 2>/dev/null
tail -n 10 "$out/compare-fla.txt"
echo "done at ${SECONDS}s"
