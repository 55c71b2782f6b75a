# Shared steps of a device call's script (source it: `. tools/device-call.sh`), so each call's
# script under bench/ holds only what that call measures. Every function writes under $out.
#
#   device_header            the GPU's name and driver into $out/gpu.txt (and stdout)
#   install_fla              FLA's wheels from .whl into /tmp/fla-site (PYTHONPATH=/tmp/fla-site)
#   run_suite BIN TEST [S]   a test executable, one test at a time with its output, at most S
#                            seconds (150); one summary line on stdout, the whole log appended
#                            to $out/tests.txt; DELTAKV_BIN=BIN for the CLI's tests
#   prefill_vs_fla BIN [PART] `BIN bench gdn --device cuda` (serving shapes and T 1024) beside
#                            FLA (tools/compare_fla_prefill.py, CUDA graphs on both sides):
#                            PART `speed` ($out/compare-fla.txt, prefill-vs-fla.csv,
#                            bench-cuda.txt), `accuracy` ($out/accuracy.txt) or `both`
#                            (default); needs install_fla first; prints each part's table

out=${OUT:-gpu-check-out}
mkdir -p "$out"

device_header() {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
}

install_fla() {
    python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null \
        || echo "FLA wheels: not installed (is .whl carried?)"
}

run_suite() {
    local bin=$1 test=$2 seconds=${3:-150} name rc
    name=$(basename "$test")
    DELTAKV_BIN="$bin" timeout "$seconds" "$test" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    rc=$?
    echo "$name rc $rc: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 2)"
    { echo "== $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
}

prefill_vs_fla() {
    local bin=$1 part=${2:-both}
    "$bin" bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json /tmp/dk.json \
        >"$out/bench-cuda.txt" 2>&1
    if [ "$part" != accuracy ]; then
        PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
            --deltakv-json /tmp/dk.json --deltakv-bin "$bin" --csv "$out/prefill-vs-fla.csv" \
            >"$out/compare-fla.txt" 2>&1
        tail -n 8 "$out/compare-fla.txt"
    fi
    if [ "$part" != speed ]; then
        PYTHONPATH=/tmp/fla-site timeout 200 python3 -u tools/compare_fla_prefill.py --skip-speed \
            --deltakv-json /tmp/dk.json --deltakv-bin "$bin" >"$out/accuracy.txt" 2>&1
        tail -n 8 "$out/accuracy.txt"
    fi
}
