#!/usr/bin/env bash
# The GPU check, in two halves: build here, run on the GPU machine (which has no Rust).
#
#   tools/gpu-check.sh build        # here: release binary + test executables with `--features
#                                   # cuda,wgpu`, stripped, gathered in .carry/ (git-ignored),
#                                   # with the Vulkan loader's .deb; FLA's wheels in .whl/
#   tools/gpu-check.sh run [quick]  # there, from the repo root, carrying .carry and .whl:
#                                   # the GPU tests, compute-sanitizer (memcheck, racecheck,
#                                   # initcheck) over them, `deltakv bench gdn --device cuda`,
#                                   # and FLA in the same call (tools/compare_fla.py); logs
#                                   # under $OUT (or ./gpu-check-out), a summary printed last.
#                                   # `quick` skips the sanitizers.
#   tools/gpu-check.sh wgpu         # there, carrying .carry: the Vulkan loader unpacked, every
#                                   # wgpu test through NVIDIA's Vulkan driver (CI=true: no
#                                   # skipping), then `bench gdn --device wgpu` beside
#                                   # `--device cuda` and wgpu's own copy rate; summary last.
set -euo pipefail
cd "$(dirname "$0")/.."
# The last line of FILE matching PATTERN, or nothing (never fails).
last() { grep -h "$1" "$2" 2>/dev/null | tail -n 1 || true; }
mode=${1:?usage: tools/gpu-check.sh build|run [quick]|wgpu}

case "$mode" in
build)
    cargo build --release --features cuda,wgpu
    rm -rf .carry && mkdir -p .carry/tests .carry/vulkan
    cp target/release/deltakv .carry/deltakv
    # The Vulkan loader and the GL dispatch libraries NVIDIA's Vulkan driver loads through (the
    # GPU machine has the driver and its ICD but maybe no loader): the lent machines' recipe.
    apt_amd64='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    mkdir -p /tmp/amd64/partial
    # shellcheck disable=SC2086
    apt-get $apt_amd64 update -qq && (cd .carry/vulkan && apt-get $apt_amd64 download libvulkan1 libegl1 libglvnd0 \
        libopengl0 libgl1 libglx0 libgles2)
    cargo test --release --features cuda,wgpu --workspace --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["target"]["kind"] == ["test"]:
        name = m["target"]["name"]
        crate = m["package_id"].split("#")[1].split("@")[0]
        # Only what the GPU modes run (the CPU suites run in CI): the carried tree is capped.
        if crate in ("deltakv-cuda", "deltakv-wgpu") or name in ("cli_device", "device_tensor"):
            shutil.copy(exe, f".carry/tests/{crate}-{name}")
'
    strip .carry/deltakv .carry/tests/*
    [ -d .whl ] || bash ../shared/tools/fla-wheels.sh .whl
    du -sh .carry .whl
    ;;
run)
    # Results in $out (at most 8 files come back from the GPU machine): gpu.txt, bench.txt,
    # compare.txt, summary.txt, the JSON and CSV records, and every log in logs.tar.gz.
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
    # GPU tests (the CPU suites run in CI): every executable of the CUDA crate, the CLI's
    # device tests (gdn-decode --device cuda against --device cpu) and the facade's device
    # tensors (a serving loop with the pool on the GPU against the oracle).
    for t in .carry/tests/deltakv-cuda-* .carry/tests/deltakv-cli_device .carry/tests/deltakv-device_tensor; do
        name=$(basename "$t")
        if DELTAKV_BIN="$PWD/.carry/deltakv" "$t" --test-threads=1 --nocapture >"$logs/$name.log" 2>&1; then
            summary+=("PASS $name: $(last 'worst rel_rms' "$logs/$name.log") $(last 'pool rel_rms against' "$logs/$name.log")")
        else
            summary+=("FAIL $name (see $name.log)")
        fi
    done
    if [ "${2:-}" != quick ]; then
        for tool in memcheck racecheck initcheck; do
            t=.carry/tests/deltakv-cuda-gdn_decode
            if compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --test-threads=1 \
                >"$logs/sanitizer-$tool.log" 2>&1; then
                summary+=("PASS compute-sanitizer $tool: $(last 'SUMMARY' "$logs/sanitizer-$tool.log")")
            else
                summary+=("FAIL compute-sanitizer $tool: $(last 'SUMMARY' "$logs/sanitizer-$tool.log")")
            fi
        done
    fi
    .carry/deltakv demo --tokens 1024 >"$logs/demo.txt" 2>&1 &&
        summary+=("PASS demo: $(last 'decode on cuda' "$logs/demo.txt")") ||
        summary+=("FAIL demo (see demo.txt)")
    .carry/deltakv bench gdn --device cuda --decode-batches 1,2,4,8,16,32,64,256 --json "$out/deltakv-decode.json" |
        tee "$out/bench.txt"
    python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
    PYTHONPATH=/tmp/fla-site python3 tools/compare_fla.py --deltakv-json "$out/deltakv-decode.json" \
        --csv "$out/decode-vs-fla.csv" 2>&1 | tee "$out/compare.txt"
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
wgpu)
    # Results in $out: vulkan.txt, wgpu-bench.txt, cuda-bench.txt, the JSON records,
    # summary.txt and every log in logs.tar.gz.
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    for f in .carry/vulkan/*.deb; do dpkg -x "$f" /; done
    ldconfig
    icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if ! ls /usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json >/dev/null 2>&1 &&
        [ -e "$icd" ]; then
        export VK_DRIVER_FILES="$icd"
        export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    fi
    export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
    {
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
        echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"
        ldconfig -p | grep libvulkan || true
    } | tee "$out/vulkan.txt"
    # Every wgpu test (CI=true: a test that finds no adapter fails), the CLI's device tests
    # (gdn, gdn-decode --device wgpu against --device cpu) and the facade's device tensors.
    for t in .carry/tests/deltakv-wgpu-* .carry/tests/deltakv-cli_device .carry/tests/deltakv-device_tensor; do
        name=$(basename "$t")
        if CI=true DELTAKV_BIN="$PWD/.carry/deltakv" "$t" --test-threads=1 --nocapture \
            >"$logs/wgpu-$name.log" 2>&1; then
            summary+=("PASS $name: $(last 'device: \|worst rel_rms' "$logs/wgpu-$name.log")")
        else
            summary+=("FAIL $name (see wgpu-$name.log)")
        fi
    done
    .carry/deltakv demo --tokens 1024 >"$logs/demo.txt" 2>&1 &&
        summary+=("PASS demo: $(last 'decode on wgpu' "$logs/demo.txt")") ||
        summary+=("FAIL demo (see demo.txt)")
    .carry/deltakv bench gdn --device wgpu --seq-lens 4096,16384 --decode-batches 1,8,32,64,256 \
        --json "$out/wgpu-gdn.json" 2>&1 | tee "$out/wgpu-bench.txt"
    .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1,8,32,64,256 \
        --json "$out/cuda-gdn.json" 2>&1 | tee "$out/cuda-bench.txt"
    summary+=("wgpu copy: $(last 'copy on wgpu' "$out/wgpu-bench.txt")")
    summary+=("wgpu decode B=256 f32: $(last 'B=256  T=1  pool f32' "$out/wgpu-bench.txt")")
    summary+=("cuda decode B=256 f32: $(last 'B=256  T=1  pool f32' "$out/cuda-bench.txt")")
    summary+=("wgpu prefill: $(last 'qwen3-next   chunk     T=16384' "$out/wgpu-bench.txt")")
    summary+=("wgpu prefill: $(last 'qwen3-next   recurrent T=16384' "$out/wgpu-bench.txt")")
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
*)
    echo "usage: tools/gpu-check.sh build|run [quick]|wgpu" >&2
    exit 2
    ;;
esac
