#!/usr/bin/env bash
# Session 34, call 2: the register outputs walk with O staged in shared memory (stmatrix, then
# 16-byte row stores during the next chunk's first products). The CUDA prefill suites with
# DELTAKV_PREFILL_STATE=registers, memcheck and racecheck over the streams test with it, ncu
# durations of the prefill's kernels at B 1, T 16384 and `bench gdn` for both passes, then
# ncu's warp-state and scheduler sections of the register outputs walk.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in .carry/s34/*; do
    name=$(basename "$t")
    DELTAKV_PREFILL_STATE=registers timeout 150 "$t" --test-threads=1 --nocapture >"/tmp/$name.log" 2>&1
    echo "registers $name rc $?: $(grep -h 'test result' "/tmp/$name.log" | tail -n 1) $(grep -h 'panicked\|FAILED' "/tmp/$name.log" | head -n 3)"
    { echo "== registers $name"; cat "/tmp/$name.log"; } >>"$out/tests.txt"
done | tee "$out/tests-summary.txt"
gzip -f "$out/tests.txt"
for tool in memcheck racecheck; do
    DELTAKV_PREFILL_STATE=registers timeout 200 compute-sanitizer --tool $tool \
        .carry/s34/deltakv-cuda-gdn_prefill_streams --test-threads=1 >"$out/$tool.txt" 2>&1
    echo "$tool: $(tail -n 1 "$out/$tool.txt")"
done
for state in default registers default registers; do
    if [ "$state" = default ]; then run="env -u DELTAKV_PREFILL_STATE"; else run="env DELTAKV_PREFILL_STATE=registers"; fi
    $run timeout 100 ncu --clock-control none -k regex:gdn_prefill -c 4 \
        --metrics gpu__time_duration.sum .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 >/tmp/ncu.txt 2>&1
    echo "state $state:"
    grep -E '^  gdn_prefill|gpu__time_duration' /tmp/ncu.txt | awk '/gdn_prefill/{k=$1} /gpu__time/{print "  " k, $(NF-1), $NF}'
    $run timeout 80 .carry/deltakv bench gdn --device cuda --seq-lens 16384 \
        --decode-batches 1 2>&1 | grep -E 'T=(16384|65536|8192|4096) '
done | tee "$out/timing.txt"
DELTAKV_PREFILL_STATE=registers timeout 120 ncu --clock-control none -k regex:outputs_regs -s 1 -c 1 \
    --section WarpStateStats --section SchedulerStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
    .carry/deltakv bench gdn --device cuda --seq-lens 16384 --decode-batches 1 >"$out/ncu-outputs-regs.txt" 2>&1
grep -E 'Duration|Stall|Warp Cycles|Issued|Eligible|Throughput|One or More' "$out/ncu-outputs-regs.txt" | head -n 40
echo "done at ${SECONDS}s"
