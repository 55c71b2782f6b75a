#!/usr/bin/env bash
# Session 34, call 4: the final source (the register walks as the default at K = 128 on sm_90a,
# the scan's transition on them). The CUDA prefill suites, the pooled prefill and the CLI's
# device tests by default; the prefill suites with DELTAKV_PREFILL_STATE=overlap; memcheck
# over the streams test; ncu's per-kernel durations at TP-8 and T 16384 (`bench gdn
# --serving`); the relay's share at 0.65 / 0.7 / 0.75; the accuracy part of
# tools/compare_fla_prefill.py beside FLA 0.6. Each step writes its own file under $OUT.
# Carries .carry/deltakv, .carry/s34, .whl.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
summary="$out/tests-summary.txt"
for state in default overlap; do
    for t in .carry/s34/*; do
        name=$(basename "$t")
        if [ "$state" = overlap ]; then
            case "$name" in *cuda-gdn_prefill*) ;; *) continue ;; esac
            run="env DELTAKV_PREFILL_STATE=overlap"
        else
            run="env -u DELTAKV_PREFILL_STATE"
        fi
        DELTAKV_BIN="$PWD/.carry/deltakv" $run timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
        echo "$state $name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)" >>"$summary"
        { echo "== $state $name"; cat "/tmp/$name.log"; } >>/tmp/tests.txt
    done
done
gzip -c /tmp/tests.txt >"$out/tests.txt.gz"
cat "$summary"
timeout 120 compute-sanitizer --tool memcheck .carry/s34/deltakv-cuda-gdn_prefill_streams \
    --test-threads=1 >/tmp/memcheck.txt 2>&1
tail -n 2 /tmp/memcheck.txt >"$out/memcheck-tail.txt"; cat "$out/memcheck-tail.txt"
echo "tests done at ${SECONDS}s"
for serving in tp8 t16384; do
    timeout 60 ncu --clock-control none -k regex:gdn_prefill -c 5 \
        --metrics gpu__time_duration.sum,launch__grid_size .carry/deltakv bench gdn --device cuda \
        --serving $serving --seq-lens 64 --decode-batches 1 >/tmp/ncu-$serving.txt 2>&1
    echo "ncu $serving:"
    grep -E '^  gdn_prefill|gpu__time_duration|launch__grid_size' /tmp/ncu-$serving.txt |
        awk '/^  gdn_prefill/{k=$1} /launch__grid_size/{g=$NF} /gpu__time/{print "  " k, "grid", g, $(NF-1), $NF}'
done >"$out/ncu.txt"
cat "$out/ncu.txt"
for share in default 0.65 0.75 default; do
    if [ "$share" = default ]; then run="env -u DELTAKV_PREFILL_RELAY"; else run="env DELTAKV_PREFILL_RELAY=$share"; fi
    echo "share $share:"
    $run timeout 60 .carry/deltakv bench gdn --device cuda --serving t16384,t4096 --seq-lens 2048 \
        --decode-batches 1 2>&1 | grep -E 'T=[0-9]+ '
done >"$out/relay-share.txt"
cat "$out/relay-share.txt"
echo "timing done at ${SECONDS}s"
.carry/deltakv bench gdn --device cuda --serving none --seq-lens 64 --decode-batches 1 \
    --json /tmp/dk.json >/dev/null 2>&1
PYTHONPATH=/tmp/fla-site timeout 140 python3 -u tools/compare_fla_prefill.py --skip-speed \
    --deltakv-json /tmp/dk.json --deltakv-bin .carry/deltakv >/tmp/accuracy.txt 2>&1
cp /tmp/accuracy.txt "$out/accuracy.txt"; tail -n 8 "$out/accuracy.txt"
echo "done at ${SECONDS}s"
