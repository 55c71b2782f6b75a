#!/usr/bin/env bash
# Session 35, call 1: the register walks' prepare without v, W's halves or U's products (T
# diag(beta)'s halves straight to the core-matrix layout, A in k's space, 64 registers, 4
# blocks per SM). The CUDA prefill suites, the pooled prefill and the CLI's device tests;
# memcheck and racecheck over the checkpoint tests' model-gates case; `bench gdn` at the four
# serving shapes, new and base (.carry/deltakv-base: 9c92b57's build, session 34 call 5)
# alternating; ncu's per-kernel durations at T 16384 and TP-8 for both.
# Carries .carry/deltakv, .carry/deltakv-base, .carry/s35.
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
for bin in deltakv deltakv-base deltakv deltakv-base; do
    echo "$bin:"
    timeout 60 .carry/$bin bench gdn --device cuda --serving t16384,tp8,b8,t4096 --seq-lens 1024 \
        --decode-batches 1 2>&1 | grep -E 'T=[0-9]+ '
done >"$out/bench.txt"
cat "$out/bench.txt"
echo "bench done at ${SECONDS}s"
for bin in deltakv deltakv-base; do
    for serving in t16384 tp8; do
        timeout 60 ncu --clock-control none -k regex:gdn_prefill -c 6 \
            --metrics gpu__time_duration.sum .carry/$bin bench gdn --device cuda \
            --serving $serving --seq-lens 64 --decode-batches 1 >/tmp/ncu.txt 2>&1
        echo "$bin $serving:"
        grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt |
            awk '/^  gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    done
done >"$out/ncu.txt"
cat "$out/ncu.txt"
echo "ncu done at ${SECONDS}s"
for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool .carry/s35/deltakv-cuda-gdn_prefill_checkpoints \
        checkpoints_with_model_gates --test-threads=1 >/tmp/$tool.txt 2>&1
    echo "$tool rc $?: $(tail -n 1 /tmp/$tool.txt)" >>"$out/sanitizers.txt"
    tail -n 5 /tmp/$tool.txt >"$out/$tool-tail.txt"
done
cat "$out/sanitizers.txt"
echo "done at ${SECONDS}s"
