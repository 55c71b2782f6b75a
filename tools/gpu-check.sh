#!/usr/bin/env bash
# The GPU check, in two halves: build here, run on the GPU machine (which has no Rust).
#
#   tools/gpu-check.sh build        # here: release binary + test executables with `--features
#                                   # cuda,wgpu` and examples/pipeline_stats and product_probe
#                                   # (deltakv-wgpu),
#                                   # stripped, gathered in .carry/ (git-ignored),
#                                   # with the Vulkan loader's .deb; FLA's wheels in .whl/
#   tools/gpu-check.sh prefill      # there: the prefill's GPU tests, compute-sanitizer memcheck
#                                   # over the prefill suite, `bench gdn --device cuda` (prefill)
#                                   # and FLA's chunk_gated_delta_rule beside it
#                                   # (tools/compare_fla_prefill.py: speed and accuracy)
#   tools/gpu-check.sh run [quick]  # there, from the repo root, carrying .carry and .whl:
#                                   # the GPU tests, compute-sanitizer (memcheck, racecheck,
#                                   # initcheck) over them, `deltakv bench gdn --device cuda`,
#                                   # and FLA in the same call (tools/compare_fla.py); logs
#                                   # under $OUT (or ./gpu-check-out), a summary printed last.
#                                   # `quick` skips the sanitizers.
#   tools/gpu-check.sh build-prefill  # here: only .carry/deltakv and the CUDA prefill and KV test
#                                   # executables that prefill-variants runs (~14 MB)
#   tools/gpu-check.sh prefill-variants  # there, carrying those: each variant (the defaults
#                                   # or NAME=VALUE settings) through the prefill suites,
#                                   # bench and ncu; see the mode
#   tools/gpu-check.sh run-kv [quick|sanitize]  # there: compressed KV on CUDA: the KV tests (CUDA pool
#                                   # against the CPU's word for word, attention against the
#                                   # oracle and the CPU at every bits pair; `kv --device cuda`
#                                   # against cpu), compute-sanitizer (memcheck, racecheck,
#                                   # initcheck, synccheck) over the CUDA KV tests, the demo's
#                                   # KV step on the GPU, `deltakv bench kv --device cuda` and
#                                   # torch SDPA over bf16 at the same shapes in the same call
#                                   # (tools/compare_sdpa.py); logs in $OUT/logs.tar.gz.
#                                   # `quick` skips the sanitizers, `sanitize` runs only them
#                                   # (the two halves fit the GPU machine's 10-minute calls).
#   tools/gpu-check.sh kv-encode    # there, carrying what build-prefill makes: the CUDA KV
#                                   # suite with the default encode and with
#                                   # DELTAKV_KV_ENCODE=lanes8, memcheck, racecheck and initcheck
#                                   # over the encode tests, the encode of 8 x 8192 tokens
#                                   # (`bench kv`) alternating both forms three times (and the
#                                   # defaults of .carry/deltakv-base, -alt, -alt2 where carried),
#                                   # and ncu's stall reasons over the first two encode launches
#                                   # (both kernels where a scheme's encode takes two);
#                                   # $OUT/summary.txt, logs in $OUT/logs.tar.gz
#   tools/gpu-check.sh kv-lab       # there, carrying .carry (`build` or `kv-lab-build` puts the
#                                   # lab in .carry/kv_lab; without it nvcc builds it there): the KV
#                                   # lab (tools/kv-lab: attention and encode variants timed
#                                   # beside copy/read ceilings, each checked), then
#                                   # compute-sanitizer memcheck and racecheck over the lab's
#                                   # small shapes and the KV attention test; logs in $OUT.
#   tools/gpu-check.sh build-py     # here: only the Python wheel built with `--features cuda`
#                                   # (stripped), pytest's wheels and the Rust test
#                                   # gdn_prefill_streams, in .carry/python (`build` makes them
#                                   # too)
#   tools/gpu-check.sh py-cuda      # there, carrying .carry/python only: the wheel installed with
#                                   # pip --no-deps into the system python, the Rust test of
#                                   # prefill on a borrowed stream, then the Python tests
#                                   # on CUDA torch tensors (crates/python/tests/test_cuda.py: FLA
#                                   # signatures against the f64 references, zero copies, the
#                                   # stream handshake) and the patched tiny Qwen3-Next on CUDA,
#                                   # then the rest of the suite; logs and figures under $OUT.
#   tools/gpu-check.sh build-candle # here: deltakv-candle's `candle-cuda` build (candle's CUDA
#                                   # backend beside deltakv's: nvcc 13.0 from /opt/cu13, CCCL
#                                   # headers from pip, link stubs for the driver's libraries),
#                                   # its tests and example in .carry/candle, the CUDA test and the
#                                   # example packed in .carry/candle.tar.xz (~11 MB)
#   tools/gpu-check.sh candle-cuda  # there, carrying .carry/candle.tar.xz: the candle ops on
#                                   # candle's CUDA tensors against the f64 oracles
#                                   # (tests/cuda.rs), compute-sanitizer memcheck over them, the
#                                   # Qwen3-Next layer example on cpu and cuda; logs in $OUT.
#   tools/gpu-check.sh wgpu [quick] # there, carrying .carry: the Vulkan loader unpacked, every
#                                   # wgpu test through NVIDIA's Vulkan driver (CI=true: no
#                                   # skipping; the KV suite included; `quick` skips them),
#                                   # nvidia-smi's clocks logged to clocks.csv, then `bench gdn` and
#                                   # `bench kv` (B 8, 32k, 4/2 bits) with `--device wgpu`
#                                   # beside `--device cuda` and wgpu's own copy rate (the
#                                   # better of a copy shader and copy_buffer_to_buffer), the
#                                   # chunked prefill's two passes timed alone and with either
#                                   # column tile; the driver's statistics for every shader
#                                   # (.carry/pipeline_stats: pipeline-stats.txt); summary last.
#   tools/gpu-check.sh wgpu-prefill # there, carrying .carry/deltakv, .carry/vulkan,
#                                   # .carry/pipeline_stats, .carry/product_probe (optional)
#                                   # and the three wgpu test executables
#                                   # coop_matrix, gdn_prefill, prefill_state_shapes: those
#                                   # suites on NVIDIA's Vulkan driver, the driver's statistics,
#                                   # the chunked prefill timed in each of WGPU_PREFILL_VARIANTS,
#                                   # CUDA's beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
# The last line of FILE matching PATTERN, or nothing (never fails).
last() { grep -h "$1" "$2" 2>/dev/null | tail -n 1 || true; }

# The Vulkan environment (tools/vulkan-env.sh: the carried loader unpacked, NVIDIA's ICD named
# where the image keeps it), and what was found, written to $1/vulkan.txt.
vulkan_setup() {
    # shellcheck source=tools/vulkan-env.sh
    . tools/vulkan-env.sh
    {
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
        echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"
        ldconfig -p | grep libvulkan || true
    } | tee "$1/vulkan.txt"
}
# The Vulkan driver's statistics for every wgpu pipeline (registers, shared memory) into
# $1/pipeline-stats.txt, where the build carried the example and the driver reports them; the
# staged and coop state kernels' lines are added to the summary.
pipeline_stats() {
    [ -x .carry/pipeline_stats ] || return 0
    .carry/pipeline_stats >"$1/pipeline-stats.txt" 2>&1 || true
    summary+=("pipeline stats: $({ grep -h 'gdn_chunk_state_staged\|gdn_chunk_state_coop\|failed\|pipeline_stats:' "$1/pipeline-stats.txt" || true; } |
        sed 's/Binary Size [0-9]*, //; s/Stack Size [0-9]*, //; s/Local Memory Size [0-9]*, //' | tr '\n' ';' | head -c 1500)")
    # The KV attention as launched at the bench's 4/2 bits (its registers bound the workgroups
    # per SM) and the bands decode as launched.
    summary+=("pipeline stats as launched: $({ grep -hF -e '("BITS_K", 4.0), ("BITS_V", 2.0), ("LANES", 8.0)] as launched' \
        -e '("ROWS", 16.0)] as launched' "$1/pipeline-stats.txt" || true; } |
        sed 's/Binary Size [0-9]*, //; s/Stack Size [0-9]*, //' | tr '\n' ';' | head -c 1000)")
}
mode=${1:?usage: tools/gpu-check.sh build|build-py|build-candle|build-prefill|run [quick]|prefill [quick]|prefill-variants|run-kv [quick|sanitize]|kv-encode|kv-lab-build|kv-lab|wgpu [quick]|wgpu-prefill|wgpu-clocks|py-cuda|candle-cuda}
# A lab (tools/kv-lab/kv_lab.cu, or the source $2) built with nvcc (PATH, else CUDA 13 under
# /opt/cu13) to $1, further arguments passed to nvcc. The prefill lab runs there as
# `.carry/prefill_lab [T]` (`prefill_lab2`: its prepare at 2 blocks per SM).
kv_lab_build() {
    local cuda=/opt/cu13/nvidia/cu13 nvcc=nvcc
    command -v nvcc >/dev/null || nvcc=$cuda/bin/nvcc
    if ! command -v "$nvcc" >/dev/null; then
        echo "no nvcc (PATH or $cuda/bin): $1 not built (the lab modes build it on the GPU machine)"
        return 0
    fi
    "$nvcc" -O3 -std=c++17 -arch=sm_90a -L"$cuda/lib" -o "$1" "${2:-tools/kv-lab/kv_lab.cu}" "${@:3}"
}

# The Python package built with `--features cuda` (cudarc loads the driver at run time, so the
# same wheel runs on the CPU without a GPU) and pytest's wheels (the GPU machine has no network),
# in .carry/python: a few MB, carried alone for `py-cuda`.
build_python() {
    rm -rf .carry/python && mkdir -p .carry/python
    local venv=target/gpu-check-py
    [ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q maturin; }
    "$venv/bin/maturin" build --release --strip --features cuda -m crates/python/Cargo.toml \
        -o .carry/python
    "$venv/bin/pip" download -q --only-binary=:all: --python-version 3.9 --dest .carry/python \
        pytest exceptiongroup tomli
    # The Rust test of prefill on a caller's (borrowed) stream, which py-cuda runs first.
    cargo test --release -p deltakv-cuda --test gdn_prefill_streams --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".carry/python/deltakv-cuda-gdn_prefill_streams")
'
    strip .carry/python/deltakv-cuda-gdn_prefill_streams
    du -sh .carry/python
}

# candle's CUDA build (deltakv-candle's `candle-cuda` feature) on a machine without the driver:
# nvcc and NVRTC 13.0 from pip's wheels under $CUDA_WHEELS (default /opt/cu13/nvidia/cu13),
# CCCL's headers from pip, and link stubs for libcuda, cuBLAS, cuBLASLt and cuRAND
# (tools/cuda_link_stubs.py); the GPU machine's real libraries load at run time. The test
# executables and the example go to .carry/candle.
build_candle() {
    local cuda=${CUDA_WHEELS:-/opt/cu13/nvidia/cu13} root=$PWD/target/candle-cuda-toolkit
    [ -x "$cuda/bin/nvcc" ] || { echo "build-candle: no nvcc under $cuda (set CUDA_WHEELS)" >&2; exit 1; }
    mkdir -p "$root/include"
    [ -d "$root/cccl/nvidia/cu13/include/cccl" ] ||
        python3 -m pip install -q --disable-pip-version-check --no-deps --target "$root/cccl" nvidia-cuda-cccl==13.0.85
    python3 tools/cuda_link_stubs.py "$root/lib64"
    ln -sf "$cuda/lib/libnvrtc.so.13" "$root/lib64/libnvrtc.so"
    ln -sf "$cuda/lib/libcudart.so.13" "$root/lib64/libcudart.so"
    ln -sfn "$cuda/bin" "$root/bin"
    for f in "$cuda"/include/* "$root"/cccl/nvidia/cu13/include/*; do ln -sfn "$f" "$root/include/${f##*/}"; done
    local cccl=$root/cccl/nvidia/cu13/include
    export CUDA_HOME=$root PATH=$root/bin:$PATH CUDA_COMPUTE_CAP=90 CARGO_TARGET_DIR=$PWD/target/candle-cuda
    export NVCC_APPEND_FLAGS="-I$cccl/cccl -I$cccl"
    rm -rf .carry/candle && mkdir -p .carry/candle
    cargo test --release -p deltakv-candle --features candle-cuda --no-run --message-format=json |
        python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".carry/candle/" + m["target"]["name"])
'
    cargo build --release -p deltakv-candle --features candle-cuda --example qwen3_next_gdn
    cp "$CARGO_TARGET_DIR/release/examples/qwen3_next_gdn" .carry/candle/
    strip .carry/candle/*
    # Each executable holds candle's kernels (~40 MB); the GPU run needs the CUDA test and the
    # example, packed small enough to carry beside other things.
    tar -C .carry/candle -cJf .carry/candle.tar.xz cuda qwen3_next_gdn
    ls -la .carry/candle .carry/candle.tar.xz
}

case "$mode" in
build-candle)
    build_candle
    ;;
candle-cuda)
    out=${OUT:-gpu-check-out}
    mkdir -p "$out/candle"
    log=$out/candle
    nvidia-smi -L > "$log/gpu.txt" 2>&1 || true
    ldconfig -p | grep -E "libcuda.so|libcublas|libcurand|libcudart|libnvrtc" > "$log/libs.txt" 2>&1 || true
    bin=$(mktemp -d)
    tar -C "$bin" -xJf .carry/candle.tar.xz
    status=0
    echo "== tests/cuda.rs" | tee -a "$log/summary.txt"
    if "$bin/cuda" --nocapture --test-threads 1 > "$log/test-cuda.txt" 2>&1; then
        grep -E "test result|skipped|qwen3-next layer" "$log/test-cuda.txt" | tee -a "$log/summary.txt"
    else
        status=1
        tail -n 30 "$log/test-cuda.txt" | tee -a "$log/summary.txt"
    fi
    echo "== memcheck over tests/cuda.rs" | tee -a "$log/summary.txt"
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/cuda" --test-threads 1 \
        > "$log/memcheck.txt" 2>&1 || status=1
    grep -E "ERROR SUMMARY|test result" "$log/memcheck.txt" | tee -a "$log/summary.txt"
    for tokens in 200 4096; do
        for dev in cpu cuda; do
            echo "== example $tokens $dev" | tee -a "$log/summary.txt"
            "$bin/qwen3_next_gdn" "$tokens" "$dev" 2>&1 | tee -a "$log/summary.txt" || status=1
        done
    done
    tar -czf "$out/candle-logs.tar.gz" -C "$out" candle
    exit $status
    ;;
build-py)
    build_python
    ;;
build)
    cargo build --release --features cuda,wgpu
    cargo build --release -p deltakv-wgpu --example pipeline_stats --example product_probe
    rm -rf .carry && mkdir -p .carry/tests .carry/vulkan
    cp target/release/deltakv .carry/deltakv
    cp target/release/examples/pipeline_stats .carry/pipeline_stats
    cp target/release/examples/product_probe .carry/product_probe
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
        # Only what the GPU modes run (the CPU suites and the Metal translation run in CI): the
        # carried tree is capped at 64 MiB.
        if name == "metal_translation":
            continue
        if crate in ("deltakv-cuda", "deltakv-wgpu") or f"{crate}-{name}" in (
            "deltakv-cli_device", "deltakv-device_tensor", "deltakv-cpu-kv_paged",
            "deltakv-prefill_pool"):
            shutil.copy(exe, f".carry/tests/{crate}-{name}")
'
    strip .carry/deltakv .carry/pipeline_stats .carry/product_probe .carry/tests/*
    kv_lab_build .carry/kv_lab
    kv_lab_build .carry/prefill_lab tools/prefill-lab/prefill_lab.cu
    kv_lab_build .carry/prefill_lab2 tools/prefill-lab/prefill_lab.cu -DPF_PREPARE_BLOCKS_PER_SM=2
    [ -d .whl ] || bash ../shared/tools/fla-wheels.sh .whl
    build_python
    du -sh .carry .whl
    ;;
py-cuda)
    # Results in $out: gpu.txt, figures.txt (every error figure the tests printed),
    # summary.txt and every log in logs.tar.gz.
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    {
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none (torch sees no CUDA GPU)")' || true
    } 2>&1 | tee "$out/gpu.txt"
    wheel=$(ls .carry/python/deltakv-*.whl)
    pip=(python3 -m pip install --no-deps --force-reinstall --no-index -q)
    "${pip[@]}" "$wheel" >"$logs/pip.log" 2>&1 || "${pip[@]}" --break-system-packages "$wheel" >>"$logs/pip.log" 2>&1
    if ! python3 -c 'import pytest' 2>/dev/null; then
        python3 -m pip install -q --no-index --find-links .carry/python --target /tmp/pytest-site pytest \
            >>"$logs/pip.log" 2>&1
        export PYTHONPATH=/tmp/pytest-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    python3 -c 'import deltakv; print("deltakv", deltakv.__file__, "CUDA_BUILT", deltakv.CUDA_BUILT)' 2>&1 | tee -a "$out/gpu.txt"
    # Prefill with an initial state on deltakv's, the legacy and a borrowed stream (Rust).
    t=.carry/python/deltakv-cuda-gdn_prefill_streams
    if [ -x "$t" ]; then
        if "$t" --test-threads=1 --nocapture >"$logs/rust-gdn_prefill_streams.log" 2>&1; then
            summary+=("PASS rust gdn_prefill_streams: $(grep -c 'final state' "$logs/rust-gdn_prefill_streams.log") runs within 4e-3")
        else
            summary+=("FAIL rust gdn_prefill_streams: $(grep -h 'FAILED\|panicked' "$logs/rust-gdn_prefill_streams.log" | head -n 3 | tr '\n' ' ')")
        fi
    fi
    # The CUDA tests first (-s: their error figures in the log), then the rest of the suite (the
    # CPU tests on the same wheel, torch CPU tensors included).
    for run in cuda:"crates/python/tests/test_cuda.py crates/python/tests/test_qwen3_next.py" \
        rest:"crates/python/tests --ignore=crates/python/tests/test_cuda.py"; do
        name=${run%%:*}
        # shellcheck disable=SC2086
        if python3 -m pytest -v -rs -s -p no:cacheprovider ${run#*:} >"$logs/pytest-$name.log" 2>&1; then
            summary+=("PASS pytest $name: $(tail -n 1 "$logs/pytest-$name.log")")
        else
            summary+=("FAIL pytest $name: $(tail -n 1 "$logs/pytest-$name.log"); $(grep -h '^FAILED\|^ERROR' "$logs/pytest-$name.log" | head -n 5 | tr '\n' ' ' || true)")
        fi
    done
    grep -h "rel_rms\|side stream\|checkpoints\|SKIPPED" "$logs/pytest-cuda.log" >"$out/figures.txt" || true
    grep -h "final state" "$logs/rust-gdn_prefill_streams.log" >>"$out/figures.txt" 2>/dev/null || true
    summary+=("$(grep -h 'patched Qwen3-Next on cuda' "$logs/pytest-cuda.log" | tr '\n' ';' || true)")
    summary+=("$(grep -h 'side stream prefill' "$logs/pytest-cuda.log" || true)")
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
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
    for t in .carry/tests/deltakv-cuda-* .carry/tests/deltakv-cli_device .carry/tests/deltakv-device_tensor \
        .carry/tests/deltakv-prefill_pool; do
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
        # The prefill suite (small shapes, every kernel of the prefill) under memcheck and
        # racecheck, each bounded so the whole check fits one GPU call.
        for tool in memcheck racecheck; do
            if timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 \
                .carry/tests/deltakv-cuda-gdn_prefill --test-threads=1 the_prefill_suite \
                >"$logs/sanitizer-prefill-$tool.log" 2>&1; then
                summary+=("PASS compute-sanitizer $tool (prefill suite): $(last 'SUMMARY' "$logs/sanitizer-prefill-$tool.log")")
            else
                summary+=("FAIL compute-sanitizer $tool (prefill suite, exit $?): $(last 'SUMMARY' "$logs/sanitizer-prefill-$tool.log")")
            fi
        done
    fi
    # The tests' verdicts and logs written now as well, so a call cut off by its time limit in
    # the benchmarks below still brings them back (both are written again at the end).
    printf '%s\n' "${summary[@]}" >"$out/summary.txt"
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    .carry/deltakv demo --tokens 1024 >"$logs/demo.txt" 2>&1 &&
        summary+=("PASS demo: $(last 'decode on cuda' "$logs/demo.txt")") ||
        summary+=("FAIL demo (see demo.txt)")
    .carry/deltakv bench gdn --device cuda --seq-lens 1024,4096,16384,65536 \
        --decode-batches 1,2,4,8,16,32,64,256 --json "$out/deltakv-decode.json" |
        tee "$out/bench.txt"
    python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
    PYTHONPATH=/tmp/fla-site python3 tools/compare_fla.py --deltakv-json "$out/deltakv-decode.json" \
        --csv "$out/decode-vs-fla.csv" 2>&1 | tee "$out/compare.txt"
    PYTHONPATH=/tmp/fla-site python3 tools/compare_fla_prefill.py --deltakv-json "$out/deltakv-decode.json" \
        --deltakv-bin .carry/deltakv --csv "$logs/prefill-vs-fla.csv" --plot "$logs/prefill-vs-fla.png" \
        2>&1 | tee "$logs/compare-prefill.txt"
    cat "$logs/compare-prefill.txt" >>"$out/compare.txt"
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
run-kv)
    # Results in $out: gpu.txt, bench-kv.txt, compare-kv.txt, kv-vs-sdpa.csv, summary.txt and
    # every log (with deltakv's JSON records) in logs.tar.gz.
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
    tests=(.carry/tests/deltakv-cuda-kv_paged .carry/tests/deltakv-cuda-kernels_compile
        .carry/tests/deltakv-cpu-kv_paged .carry/tests/deltakv-cli_device)
    [ "${2:-}" = sanitize ] && tests=()
    for t in ${tests[@]+"${tests[@]}"}; do
        name=$(basename "$t")
        if DELTAKV_BIN="$PWD/.carry/deltakv" "$t" --test-threads=1 --nocapture >"$logs/$name.log" 2>&1; then
            summary+=("PASS $name: $(last 'worst rel_rms' "$logs/$name.log") $(last 'against --device cpu' "$logs/$name.log") $(last 'test result' "$logs/$name.log")")
        else
            summary+=("FAIL $name (see $name.log): $(last 'panicked' "$logs/$name.log")")
        fi
    done
    if [ "${2:-}" != quick ]; then
        for tool in memcheck racecheck initcheck synccheck; do
            if compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/tests/deltakv-cuda-kv_paged \
                --test-threads=1 >"$logs/sanitizer-kv-$tool.log" 2>&1; then
                summary+=("PASS compute-sanitizer $tool (kv): $(last 'SUMMARY' "$logs/sanitizer-kv-$tool.log")")
            else
                summary+=("FAIL compute-sanitizer $tool (kv): $(last 'SUMMARY' "$logs/sanitizer-kv-$tool.log")")
            fi
        done
    fi
    if [ "${2:-}" = sanitize ]; then
        tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
        printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
        exit 0
    fi
    .carry/deltakv demo --tokens 1024 >"$logs/demo.txt" 2>&1 &&
        summary+=("PASS demo: $(last 'compressed KV on cuda' "$logs/demo.txt")") ||
        summary+=("FAIL demo (see demo.txt): $(last 'compressed KV on cuda' "$logs/demo.txt")")
    { .carry/deltakv bench kv --device cuda --batch 8 --contexts 4096,32768 --json "$logs/bench-kv-b8.json" &&
        .carry/deltakv bench kv --device cuda --batch 1 --contexts 32768,131072 --json "$logs/bench-kv-b1.json"; } 2>&1 |
        tee "$out/bench-kv.txt" || summary+=("FAIL bench kv --device cuda (see bench-kv.txt)")
    python3 tools/compare_sdpa.py --deltakv .carry/deltakv --json-dir "$logs" \
        --csv "$out/kv-vs-sdpa.csv" 2>&1 | tee "$out/compare-kv.txt" || summary+=("FAIL compare_sdpa.py")
    summary+=("$(grep -h 'PASS\|FAIL' "$out/compare-kv.txt" 2>/dev/null | tr '\n' ';' || true)")
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
kv-encode)
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
    for form in default lanes8; do
        env $([ $form = lanes8 ] && echo DELTAKV_KV_ENCODE=lanes8) .carry/tests/deltakv-cuda-kv_paged \
            --test-threads=1 --nocapture >"$logs/kv-$form.log" 2>&1 &&
            summary+=("PASS kv_paged ($form): $(grep -c 'pool identical' "$logs/kv-$form.log") encode schemes identical; $(last 'test result' "$logs/kv-$form.log")") ||
            summary+=("FAIL kv_paged ($form): $(grep -h 'panicked\|differ' "$logs/kv-$form.log" | head -n 3 | tr '\n' ' ')")
    done
    for tool in memcheck racecheck initcheck; do
        compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/tests/deltakv-cuda-kv_paged --test-threads=1 \
            encode a_failed_append >"$logs/sanitizer-$tool.log" 2>&1 &&
            summary+=("PASS compute-sanitizer $tool (encode tests): $(last 'SUMMARY' "$logs/sanitizer-$tool.log")") ||
            summary+=("FAIL compute-sanitizer $tool (encode tests): $(last 'SUMMARY' "$logs/sanitizer-$tool.log")")
    done
    # encode LABEL [NAME=VALUE ...]; BIN picks the binary (.carry/deltakv).
    encode() {
        env "${@:2}" "${BIN:-.carry/deltakv}" bench kv --device cuda --batch 1 --contexts 4096 >"$logs/bench-$1.txt" 2>&1
        summary+=("$1: $(last 'encode' "$logs/bench-$1.txt" | tr -s ' ')")
    }
    encode warm-up
    for i in 1 2 3; do
        encode "lanes8-$i" DELTAKV_KV_ENCODE=lanes8
        encode "default-$i"
        # Builds carried beside (main's as deltakv-base, trials as deltakv-alt, -alt2) run their
        # default encode in the same turns.
        for other in base alt alt2; do
            if [ -x ".carry/deltakv-$other" ]; then BIN=".carry/deltakv-$other" encode "$other-$i"; fi
        done
    done
    ncu -k regex:kv_encode_ -c 2 --section SpeedOfLight --section SchedulerStats \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        .carry/deltakv bench kv --device cuda --batch 1 --contexts 4096 >"$logs/ncu-encode.txt" 2>&1
    summary+=("ncu stalls per issued instruction: $(grep -h 'issue_stalled' "$logs/ncu-encode.txt" | awk '$NF+0 > 0.05 {print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | tr '\n' ';')")
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
prefill)
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
    t=.carry/tests/deltakv-cuda-gdn_prefill
    if "$t" --test-threads=1 --nocapture >"$logs/prefill-tests.log" 2>&1; then
        summary+=("PASS gdn_prefill tests")
    else
        summary+=("FAIL gdn_prefill tests: $(grep -h 'panicked\|FAILED\|failed' "$logs/prefill-tests.log" | head -n 3 | tr '\n' ' ')")
    fi
    grep -h "rel_rms\|: o \|drift" "$logs/prefill-tests.log" | tail -n 80 >"$out/prefill-errors.txt" || true
    # The state checkpoints (every case whole and in forced segments), and memcheck over one.
    t=.carry/tests/deltakv-cuda-gdn_prefill_checkpoints
    if "$t" --test-threads=1 --nocapture >"$logs/prefill-checkpoints.log" 2>&1; then
        summary+=("PASS gdn_prefill_checkpoints tests")
    else
        summary+=("FAIL gdn_prefill_checkpoints tests: $(grep -h 'panicked\|FAILED\|failed' "$logs/prefill-checkpoints.log" | head -n 3 | tr '\n' ' ')")
    fi
    grep -h "checkpoints, worst\|pooled checkpoints" "$logs/prefill-checkpoints.log" >>"$out/prefill-errors.txt" || true
    if [ "${2:-}" != quick ]; then
        if compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --test-threads=1 \
            checkpoints_of_varlen >"$logs/sanitizer-checkpoints.log" 2>&1; then
            summary+=("PASS compute-sanitizer memcheck (checkpoints): $(last 'SUMMARY' "$logs/sanitizer-checkpoints.log")")
        else
            summary+=("FAIL compute-sanitizer memcheck (checkpoints): $(last 'SUMMARY' "$logs/sanitizer-checkpoints.log")")
        fi
    fi
    t=.carry/tests/deltakv-cuda-gdn_prefill
    if [ "${2:-}" != quick ]; then
        for tool in memcheck racecheck; do
            if compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --test-threads=1 \
                the_prefill_suite >"$logs/sanitizer-$tool.log" 2>&1; then
                summary+=("PASS compute-sanitizer $tool (prefill suite): $(last 'SUMMARY' "$logs/sanitizer-$tool.log")")
            else
                summary+=("FAIL compute-sanitizer $tool (prefill suite): $(last 'SUMMARY' "$logs/sanitizer-$tool.log")")
            fi
        done
    fi
    .carry/deltakv bench gdn --device cuda --seq-lens 1024,4096,16384,65536 --decode-batches 1 \
        --json "$out/deltakv-prefill.json" 2>&1 | tee "$out/bench.txt"
    python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null
    PYTHONPATH=/tmp/fla-site python3 tools/compare_fla_prefill.py --deltakv-json "$out/deltakv-prefill.json" \
        --deltakv-bin .carry/deltakv --csv "$out/prefill-vs-fla.csv" --plot "$out/prefill-vs-fla.png" \
        ${PREFILL_COMPARE_FLAGS:-} 2>&1 | tee "$out/compare.txt"
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
build-prefill)
    # Here: only what `prefill-variants` carries (~16 MB): the binary as `build` makes it and
    # the CUDA test executables of the prefill and the compressed KV cache, in .carry/ (other
    # files there are kept).
    cargo build --release --features cuda,wgpu
    mkdir -p .carry/tests
    cp target/release/deltakv .carry/deltakv
    cargo test --release -p deltakv-cuda --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["target"]["kind"] == ["test"]:
        name = m["target"]["name"]
        if name in ("gdn_prefill", "gdn_prefill_checkpoints", "gdn_prefill_streams", "kernels_compile",
                    "kv_paged"):
            shutil.copy(exe, f".carry/tests/deltakv-cuda-{name}")
'
    strip .carry/deltakv .carry/tests/deltakv-cuda-gdn_prefill* .carry/tests/deltakv-cuda-kernels_compile \
        .carry/tests/deltakv-cuda-kv_paged
    du -sh .carry/deltakv .carry/tests/deltakv-cuda-gdn_prefill* .carry/tests/deltakv-cuda-kernels_compile \
        .carry/tests/deltakv-cuda-kv_paged
    ;;
prefill-variants)
    # Each variant (PREFILL_VARIANTS, default "default DELTAKV_PREFILL_STATE=overlap
    # DELTAKV_PREFILL_STATE=lockstep":
    # `default` the library's defaults, `NAME=VALUE` that variable, e.g.
    # DELTAKV_PREFILL_RELAY=off; with
    # PREFILL_SUITES=first only the first variant runs the suites) through the prefill suites, then
    # `bench gdn` at T 4096 and 16384 and ncu's per-kernel times at T 16384; then, while the
    # call has time (PREFILL_VARIANTS_BUDGET seconds, default 470), compute-sanitizer memcheck
    # and racecheck over one small test with the last variant, the loaded kernels' local
    # memory (spills), and FLA's accuracy beside each variant's (when .whl is carried).
    # Carries only .carry/deltakv and .carry/tests/deltakv-cuda-{gdn_prefill,
    # gdn_prefill_checkpoints,gdn_prefill_streams,kernels_compile} (from `build`). Results:
    # $out/prefill-variants.tar.gz and $out/summary.txt (printed last).
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/prefill-variants
    mkdir -p "$out" "$logs"
    summary=()
    budget=${PREFILL_VARIANTS_BUDGET:-470}
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$logs/gpu.txt"
    variants=${PREFILL_VARIANTS:-default DELTAKV_PREFILL_STATE=overlap DELTAKV_PREFILL_STATE=lockstep}
    use() {
        unset DELTAKV_PREFILL_STATE DELTAKV_PREFILL_RELAY DELTAKV_PREFILL_RELAY_MIN_CHUNKS DELTAKV_PREFILL_SEGMENT_CHUNKS
        case "$1" in
        default) ;;
        *=*) export "${1?}" ;;
        *) echo "prefill-variants: a variant is \`default\` or NAME=VALUE, not \`$1\`" >&2; exit 2 ;;
        esac
    }
    first_variant=${variants%% *}
    for variant in $variants; do
        use "$variant"
        suites="gdn_prefill gdn_prefill_checkpoints gdn_prefill_streams"
        [ "${PREFILL_SUITES:-all}" = first ] && [ "$variant" != "$first_variant" ] && suites=""
        for suite in $suites; do
            log=$logs/$variant-$suite.log
            if timeout 150 ".carry/tests/deltakv-cuda-$suite" --test-threads=1 --nocapture >"$log" 2>&1; then
                summary+=("PASS $variant: $suite ($(last 'test result' "$log"))")
            else
                summary+=("FAIL $variant: $suite: $(grep -h 'panicked\|FAILED\|failed' "$log" | head -n 3 | tr '\n' ' ')")
            fi
        done
        if [ -n "$suites" ]; then
            worst=$(grep -ho ': o [0-9.e+-]*' "$logs/$variant-gdn_prefill.log" | awk '{print $3}' | sort -g | tail -n 1)
            summary+=("$variant: worst o rel_rms over the prefill suite ${worst:-?}")
        fi
        timeout 120 .carry/deltakv bench gdn --device cuda --seq-lens 4096,16384 --decode-batches 1 \
            --json "$logs/$variant-bench.json" >"$logs/$variant-bench.txt" 2>&1 ||
            summary+=("FAIL $variant: bench (exit $?)")
        summary+=("$variant bench: $(grep -h 'T=16384\|T=4096' "$logs/$variant-bench.txt" | tr -s ' ' | tr '\n' ';')")
        timeout 120 ncu --clock-control none --graph-profiling node -k regex:gdn_prefill -c 12 \
            --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
            --decode-batches 1 >"$logs/$variant-ncu.txt" 2>&1 || summary+=("FAIL $variant: ncu (exit $?)")
        summary+=("$variant ncu (us): $(grep -E '^  gdn|duration' "$logs/$variant-ncu.txt" |
            awk '/^  gdn/ {name=$1} /duration/ {sum[name] += $NF; n[name]++}
                END {for (k in sum) printf "%s %.1f (mean of %d); ", k, sum[k] / n[k], n[k]}')")
    done
    # The first variant under the sanitizers, on small shapes (segments, relays, varlen, resets).
    use "$first_variant"
    for tool in memcheck racecheck; do
        [ "$SECONDS" -lt "$budget" ] || { summary+=("skipped compute-sanitizer $tool: out of time"); continue; }
        t=.carry/tests/deltakv-cuda-gdn_prefill
        if timeout 100 compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --test-threads=1 \
            gate_extremes >"$logs/sanitizer-$tool.log" 2>&1; then
            summary+=("PASS compute-sanitizer $tool ($first_variant, gate_extremes): $(last 'SUMMARY' "$logs/sanitizer-$tool.log")")
        else
            summary+=("FAIL compute-sanitizer $tool ($first_variant, gate_extremes, exit $?): $(last 'SUMMARY' "$logs/sanitizer-$tool.log")")
        fi
    done
    t=.carry/tests/deltakv-cuda-kernels_compile
    if [ "$SECONDS" -ge "$budget" ]; then
        summary+=("skipped loaded kernels' local memory: out of time")
    elif timeout 90 "$t" --test-threads=1 --nocapture every_loaded_kernel >"$logs/local-memory.log" 2>&1; then
        summary+=("PASS loaded kernels use no local memory: $(grep -h 'prepare.*k128_v128' "$logs/local-memory.log" | tr '\n' ' ')")
    else
        summary+=("FAIL loaded kernels' local memory: $(grep -h 'panicked' "$logs/local-memory.log" | head -n 2 | tr '\n' ' ')")
    fi
    if [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl 2>/dev/null; then
        # FLA's speed once, in this call, beside the variants' bench lines (the peer a ratio
        # needs), at the shapes of the first variant's bench.
        first=${variants%% *}
        use "$first"
        # FLA compiles and tunes its kernels at each shape first (two minutes or more): it takes
        # what is left of a 10-minute call.
        fla_left=$((570 - SECONDS))
        if [ "$SECONDS" -lt "$budget" ] && PYTHONPATH=/tmp/fla-site timeout "$fla_left" python3 -u \
            tools/compare_fla_prefill.py --skip-accuracy --deltakv-json "$logs/$first-bench.json" \
            --deltakv-bin .carry/deltakv >"$logs/fla-speed.txt" 2>&1; then
            summary+=("FLA speed beside $first: $(grep -h ' 16384 ' "$logs/fla-speed.txt" | tr -s ' ' | tr '\n' ';')")
        else
            summary+=("FLA speed: not measured (out of time or exit $?; see fla-speed.txt)")
        fi
        for variant in $variants; do
            [ "$SECONDS" -lt "$budget" ] || { summary+=("skipped $variant: FLA accuracy: out of time"); continue; }
            use "$variant"
            PYTHONPATH=/tmp/fla-site timeout $((570 - SECONDS)) python3 -u tools/compare_fla_prefill.py --skip-speed \
                --deltakv-json "$logs/$variant-bench.json" --deltakv-bin .carry/deltakv \
                >"$logs/$variant-accuracy.txt" 2>&1 || summary+=("FAIL $variant: FLA accuracy (exit $?)")
            summary+=("$variant accuracy (dk o, dk state, FLA o, FLA state): $(grep -h 'Hg16 H32' "$logs/$variant-accuracy.txt" | tr -s ' ')")
        done
    fi
    unset DELTAKV_PREFILL_STATE DELTAKV_PREFILL_RELAY DELTAKV_PREFILL_RELAY_MIN_CHUNKS DELTAKV_PREFILL_SEGMENT_CHUNKS
    printf '%s\n' "${summary[@]}" >"$logs/summary.txt"
    tar czf "$out/prefill-variants.tar.gz" -C "$(dirname "$logs")" prefill-variants
    cp "$logs/summary.txt" "$out/summary.txt"
    echo "== summary ($SECONDS s)"
    cat "$out/summary.txt"
    ;;
kv-lab-build)
    # Here: only the lab, into .carry/kv_lab (what `build` also does).
    mkdir -p .carry
    kv_lab_build .carry/kv_lab
    ;;
kv-lab)
    # Results in $out: gpu.txt, kv-lab.txt, summary.txt and the sanitizer logs in logs.tar.gz.
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
    lab=.carry/kv_lab
    [ -x "$lab" ] || { lab=$(mktemp -d)/kv_lab && kv_lab_build "$lab"; }
    timeout 150 "$lab" all 2>&1 | tee "$out/kv-lab.txt" || summary+=("FAIL kv_lab (exit $?)")
    summary+=("kv_lab: $(grep -c ' ok$' "$out/kv-lab.txt" || true) ok, $(grep -c 'FAIL' "$out/kv-lab.txt" || true) FAIL")
    for tool in memcheck racecheck; do
        if timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 9 "$lab" small \
            >"$logs/sanitizer-lab-$tool.log" 2>&1; then
            summary+=("PASS compute-sanitizer $tool (kv_lab small): $(last 'SUMMARY' "$logs/sanitizer-lab-$tool.log")")
        else
            summary+=("FAIL compute-sanitizer $tool (kv_lab small, exit $?): $(last 'SUMMARY' "$logs/sanitizer-lab-$tool.log")")
        fi
        t=.carry/tests/deltakv-cuda-kv_paged
        if ! [ -x "$t" ]; then
            summary+=("skipped compute-sanitizer $tool (kv attention test): no $t (run build here)")
        elif timeout 75 compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" \
            --test-threads=1 attention_equals >"$logs/sanitizer-kv-$tool.log" 2>&1; then
            summary+=("PASS compute-sanitizer $tool (kv attention test): $(last 'SUMMARY' "$logs/sanitizer-kv-$tool.log")")
        else
            summary+=("FAIL compute-sanitizer $tool (kv attention test, exit $?): $(last 'SUMMARY' "$logs/sanitizer-kv-$tool.log")")
        fi
    done
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
wgpu-clocks)
    # Whether the GPU's clocks explain the wgpu benches' slow first figures: nvidia-smi logs the
    # SM and memory clocks and the performance state every 100 ms while `bench gdn --device
    # wgpu` runs twice in fresh processes (prefill T 16384, then decode B 1, 64, 256), carrying
    # .carry/deltakv and .carry/vulkan; clocks.csv and the two bench outputs in $OUT.
    out=${OUT:-gpu-check-out}
    mkdir -p "$out"
    vulkan_setup "$out"
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate,power.draw,utilization.gpu \
        --format=csv -lms 100 >"$out/clocks.csv" 2>&1 &
    smi=$!
    sleep 1
    for run in 1 2; do
        echo "== run $run start $(date +%T.%N)" >>"$out/marks.txt"
        .carry/deltakv bench gdn --device wgpu --seq-lens 16384 --modes chunk \
            --decode-batches 1,64,256 >"$out/bench-$run.txt" 2>&1 || true
        echo "== run $run end $(date +%T.%N)" >>"$out/marks.txt"
    done
    sleep 1
    kill "$smi" || true
    cat "$out/marks.txt"
    grep -h "T=16384\|passes\|B=256\|B=64 " "$out"/bench-*.txt
    ;;
wgpu-prefill)
    # The wgpu chunked prefill alone, carrying .carry/deltakv, .carry/vulkan and the test
    # executables deltakv-wgpu-{coop_matrix,gdn_prefill,prefill_state_shapes}: the suites
    # through NVIDIA's Vulkan driver (the first one the cooperative-matrix probe), then `bench gdn
    # --device wgpu` (chunk mode, T 4096 and 16384, and the tensor-parallel shard at 65536) in
    # each of WGPU_PREFILL_VARIANTS (default: the default plan and the state pass on cooperative
    # matrices), beside `bench gdn --device cuda`'s prefill; then the cooperative-matrix rates in
    # a run of their own. A variant's settings are joined by "+" (DELTAKV_WGPU_PREFILL_ is
    # prefixed to those that do not start with DELTAKV_), e.g. SEGMENT_CHUNKS=64 or
    # STATE=coop+DELTAKV_WGPU_COOP=1.
    out=${OUT:-gpu-check-out}
    mkdir -p "$out"
    vulkan_setup "$out"
    summary=()
    pipeline_stats "$out"
    # The state pass's products alone (examples/product_probe.rs), one workgroup per SM and
    # eight, where the build carried it.
    if [ -x .carry/product_probe ]; then
        for groups in 132 1056; do .carry/product_probe "$groups" || true; done >"$out/product-probe.txt" 2>&1
        summary+=("product probe: $({ grep -h ' us \|product_probe:' "$out/product-probe.txt" || true; } |
            sed -E 's/ *\(.*; ([0-9]+ workgroups).*/ (\1)/' | tr -s ' ' | tr '\n' ';')")
    fi
    for t in .carry/tests/deltakv-wgpu-coop_matrix .carry/tests/deltakv-wgpu-gdn_prefill \
        .carry/tests/deltakv-wgpu-prefill_state_shapes; do
        name=$(basename "$t")
        coop=$([ "$name" = deltakv-wgpu-coop_matrix ] && echo 1 || echo 0)
        if CI=true DELTAKV_WGPU_COOP=$coop "$t" --test-threads=1 --nocapture >"$out/$name.log" 2>&1; then
            summary+=("PASS $name: $(last 'worst rel_rms\|tiles of 16\|in Workgroup\|matrices: skipped\|device: ' "$out/$name.log")")
        else
            summary+=("FAIL $name (see $name.log)")
        fi
    done
    # shellcheck disable=SC2086
    for variant in ${WGPU_PREFILL_VARIANTS:-default STATE=coop+DELTAKV_WGPU_COOP=1}; do
        settings=(DELTAKV_NOTHING=1)
        if [ "$variant" != default ]; then
            IFS=+ read -r -a parts <<<"$variant"
            settings=()
            for part in "${parts[@]}"; do
                case $part in
                DELTAKV_*) settings+=("$part") ;;
                *) settings+=("DELTAKV_WGPU_PREFILL_$part") ;;
                esac
            done
        fi
        echo "== $variant" >>"$out/wgpu-prefill-bench.txt"
        env "${settings[@]}" .carry/deltakv bench gdn --device wgpu --seq-lens 4096,16384 --modes chunk \
            --decode-batches 1 >"$out/variant.txt" 2>&1 || true
        cat "$out/variant.txt" >>"$out/wgpu-prefill-bench.txt"
        for shape in 'qwen3-next   chunk     T=16384' 'tp8-shard    chunk     T=65536'; do
            summary+=("wgpu prefill $variant: $({ grep -h -A1 "$shape" "$out/variant.txt" || true; } | tr '\n' ' ')")
        done
    done
    rm -f "$out/variant.txt"
    echo "== DELTAKV_WGPU_COOP=1" >>"$out/wgpu-prefill-bench.txt"
    DELTAKV_WGPU_COOP=1 .carry/deltakv bench gdn --device wgpu --seq-lens 4096 --modes chunk \
        --decode-batches 1 >>"$out/wgpu-prefill-bench.txt" 2>&1 || true
    units=$({ grep -h -m2 'cooperative matrices on wgpu\|cooperative split' "$out/wgpu-prefill-bench.txt" || true; } | tr '\n' ' ')
    summary+=("wgpu matrix units (DELTAKV_WGPU_COOP=1): ${units:-none (see wgpu-prefill-bench.txt)}")
    .carry/deltakv bench gdn --device cuda --seq-lens 4096,16384 --decode-batches 1 \
        >"$out/cuda-prefill-bench.txt" 2>&1 || true
    summary+=("cuda prefill: $({ grep -h 'B=1  T=16384\|tp8-shard' "$out/cuda-prefill-bench.txt" || true; } | head -n 2 | tr '\n' ' ')")
    printf '%s\n' "== summary" "${summary[@]}" | tee "$out/summary.txt"
    ;;
wgpu)
    # Results in $out: vulkan.txt, wgpu-bench.txt, cuda-bench.txt, the JSON records,
    # summary.txt and every log in logs.tar.gz.
    out=${OUT:-gpu-check-out}
    logs=$(mktemp -d)/logs
    mkdir -p "$out" "$logs"
    summary=()
    vulkan_setup "$out"
    pipeline_stats "$out"
    # Every wgpu test (CI=true: a test that finds no adapter fails), the CLI's device tests
    # (gdn, gdn-decode --device wgpu against --device cpu) and the facade's device tensors;
    # `wgpu quick` skips them (then only .carry/deltakv and .carry/vulkan are needed).
    tests=(.carry/tests/deltakv-wgpu-* .carry/tests/deltakv-cli_device .carry/tests/deltakv-device_tensor)
    [ "${2:-}" = quick ] && tests=()
    for t in "${tests[@]}"; do
        name=$(basename "$t")
        # Cooperative matrices (experimental in wgpu) only for their own suite.
        coop=$([ "$name" = deltakv-wgpu-coop_matrix ] && echo 1 || echo 0)
        if CI=true DELTAKV_WGPU_COOP=$coop DELTAKV_BIN="$PWD/.carry/deltakv" "$t" \
            --test-threads=1 --nocapture >"$logs/wgpu-$name.log" 2>&1; then
            summary+=("PASS $name: $(last 'device: \|worst rel_rms\|tiles of 16\|in Workgroup\|matrices: skipped' "$logs/wgpu-$name.log")")
        else
            summary+=("FAIL $name (see wgpu-$name.log)")
        fi
    done
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu \
        --format=csv -lms 200 >"$logs/clocks.csv" 2>&1 &
    smi=$!
    .carry/deltakv demo --tokens 1024 >"$logs/demo.txt" 2>&1 &&
        summary+=("PASS demo: $(last 'decode on wgpu' "$logs/demo.txt")") ||
        summary+=("FAIL demo (see demo.txt)")
    .carry/deltakv bench gdn --device wgpu --seq-lens 4096,16384 --decode-batches 1,8,32,64,256 \
        --json "$out/wgpu-gdn.json" 2>&1 | tee "$out/wgpu-bench.txt"
    .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1,8,32,64,256 \
        --json "$out/cuda-gdn.json" 2>&1 | tee "$out/cuda-bench.txt"
    DELTAKV_WGPU_COOP=1 .carry/deltakv bench gdn --device wgpu --seq-lens 4096 --modes chunk \
        --decode-batches 1 >"$logs/wgpu-bench-coop.txt" 2>&1 || true
    units=$({ grep -h -m2 'cooperative matrices on wgpu\|cooperative split' "$logs/wgpu-bench-coop.txt" || true; } | tr '\n' ' ')
    summary+=("wgpu matrix units (DELTAKV_WGPU_COOP=1): ${units:-none (see wgpu-bench-coop.txt)}")
    summary+=("wgpu copy: $(last 'copy on wgpu' "$out/wgpu-bench.txt")")
    summary+=("wgpu decode B=256 f32: $(last 'B=256  T=1  pool f32     ' "$out/wgpu-bench.txt")")
    summary+=("wgpu decode tiles: $({ grep -h ' tile ' "$out/wgpu-bench.txt" || true; } | sed 's/  */ /g' | tr '\n' ';')")
    summary+=("cuda decode B=256 f32: $(last 'B=256  T=1  pool f32' "$out/cuda-bench.txt")")
    summary+=("wgpu prefill: $(last 'qwen3-next   chunk     T=16384' "$out/wgpu-bench.txt")")
    summary+=("wgpu prefill passes (default: 16-column tiles, 32 row groups): $({ grep -h -A1 'qwen3-next   chunk     T=16384' "$out/wgpu-bench.txt" || true; } | tail -n 1)")
    # The chunked prefill's other kernels (the variables of docs/wgpu.md).
    for variant in STATE=general PREPARE=general; do
        env "DELTAKV_WGPU_PREFILL_$variant" .carry/deltakv bench gdn --device wgpu --seq-lens 16384 \
            --modes chunk --decode-batches 1 >"$logs/wgpu-bench-$variant.txt" 2>&1 || true
        summary+=("wgpu prefill $variant: $({ grep -h -A1 'qwen3-next   chunk     T=16384' "$logs/wgpu-bench-$variant.txt" || true; } | tr '\n' ' ')")
    done
    summary+=("wgpu prefill: $(last 'qwen3-next   recurrent T=16384' "$out/wgpu-bench.txt")")
    # Compressed KV at the issue's shape: B 8, 32k context, Hq 32, Hkv 8, d 128, 4/2 bits.
    .carry/deltakv bench kv --device wgpu --batch 8 --contexts 32768 --bits-k 4 --bits-v 2 \
        --json "$logs/wgpu-kv.json" 2>&1 | tee "$out/wgpu-kv-bench.txt" ||
        summary+=("FAIL bench kv --device wgpu (see wgpu-kv-bench.txt)")
    .carry/deltakv bench kv --device cuda --batch 8 --contexts 32768 --bits-k 4 --bits-v 2 \
        --json "$logs/cuda-kv.json" 2>&1 | tee -a "$out/wgpu-kv-bench.txt" ||
        summary+=("FAIL bench kv --device cuda (see wgpu-kv-bench.txt)")
    summary+=("wgpu kv copy: $(last 'buffer to buffer on wgpu' "$out/wgpu-kv-bench.txt")")
    summary+=("wgpu kv encode: $({ grep -h 'encode .*bf16.*M tokens' "$out/wgpu-kv-bench.txt" || true; } | head -n 1 | head -c 300)")
    summary+=("kv decode B=8 32k (wgpu forms first, then cuda): $({ grep -h 'decode      B=8 ctx=32768' "$out/wgpu-kv-bench.txt" || true; } | sed 's/  */ /g' | tr '\n' ';')")
    summary+=("wgpu kv decode splits (default form): $({ grep -h '^            [0-9]* splits:' "$out/wgpu-kv-bench.txt" || true; } | sed 's/  */ /g' | tr '\n' ';')")
    summary+=("demo kv: $(last 'compressed KV on wgpu' "$logs/demo.txt")")
    kill "$smi" || true
    tar czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
    echo "== summary"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    ;;
*)
    echo "usage: tools/gpu-check.sh build|build-py|run [quick]|prefill [quick]|build-prefill|prefill-variants|run-kv [quick|sanitize]|kv-lab-build|kv-lab|wgpu|wgpu-prefill|py-cuda|candle-cuda" >&2
    exit 2
    ;;
esac
