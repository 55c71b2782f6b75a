#!/usr/bin/env bash
# Session 35, call 5: the prepare's diagonal blocks by one thread per column (head of the
# session's branch of work; .carry/deltakv-base is d11869c's build). The CUDA prefill suites,
# the pooled prefill and the CLI's device tests; memcheck and racecheck over the prefill
# suite's checkpoint odd-lengths case; ncu's prepare duration at T 16384 for both; `bench gdn`
# at the serving shapes for both, alternating; FLA 0.6 beside the new build.
# Carries .carry/deltakv, .carry/deltakv-base, .carry/s35, .whl.
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
grep -h "o [0-9]" /tmp/deltakv-cuda-gdn_prefill.log | sort -t' ' -k5 -g | tail -n 3 >"$out/worst.txt"
cat "$summary"
echo "tests done at ${SECONDS}s"
for bin in deltakv deltakv-base; do
    timeout 60 ncu --clock-control none -k regex:gdn_prefill_prepare -c 2 \
        --metrics gpu__time_duration.sum,smsp__inst_executed.sum .carry/$bin bench gdn --device cuda \
        --serving t16384 --seq-lens 64 --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "$bin: $(grep -E 'gpu__time_duration|smsp__inst_executed' /tmp/ncu.txt | awk '{print $(NF-1), $NF}' | tr '\n' ' ')"
done >"$out/ncu.txt"
cat "$out/ncu.txt"
for bin in deltakv deltakv-base deltakv deltakv-base; do
    echo "$bin:"
    timeout 60 .carry/$bin bench gdn --device cuda --serving t16384,tp8,b8,t4096 --seq-lens 1024 \
        --decode-batches 1 2>&1 | grep -E 'T=[0-9]+ '
done >"$out/bench.txt"
cat "$out/bench.txt"
echo "bench done at ${SECONDS}s"
timeout 100 compute-sanitizer --tool racecheck .carry/s35/deltakv-cuda-gdn_prefill_checkpoints \
    checkpoints_at_odd_lengths --test-threads=1 >/tmp/racecheck.txt 2>&1
echo "racecheck rc $?: $(tail -n 1 /tmp/racecheck.txt)" >>"$out/sanitizers.txt"
timeout 100 compute-sanitizer --tool memcheck .carry/s35/deltakv-cuda-gdn_prefill_checkpoints \
    --test-threads=1 >/tmp/memcheck.txt 2>&1
echo "memcheck rc $?: $(tail -n 1 /tmp/memcheck.txt)" >>"$out/sanitizers.txt"
cat "$out/sanitizers.txt"
echo "sanitizers done at ${SECONDS}s"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
.carry/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 \
    --json /tmp/deltakv-prefill.json >"$out/bench-cuda.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 170 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
    --deltakv-json /tmp/deltakv-prefill.json --deltakv-bin .carry/deltakv \
    --csv /tmp/prefill-vs-fla.csv >/tmp/compare-fla.txt 2>&1
cp /tmp/compare-fla.txt /tmp/prefill-vs-fla.csv "$out/" 2>/dev/null
tail -n 8 "$out/compare-fla.txt"
echo "done at ${SECONDS}s"
