#!/bin/bash
# Session 21, call 8 (two calls on one warm machine): FlashInfer 0.7.2 beside FLA 0.6 and
# f6a8651's binary (the submitted kernels). The payload (../shared/tools/flashinfer-payload.sh split in three parts, the
# third under 1 MB) comes in two calls: `call8.sh 1` copies part 1 to /tmp/fi; `call8.sh 2`
# adds parts 2 and 3, unpacks them, runs `deltakv bench gdn` at the standard shapes and
# tools/compare_fla_prefill.py --flashinfer (speed) beside it.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
part=${1:?part 1 or 2}
mkdir -p /tmp/fi && cp .carry/fi/$part/* /tmp/fi/ && ls -la /tmp/fi > "$out/summary.txt"
[ "$part" = 2 ] || exit 0
cp .carry/fi/3/* /tmp/fi/
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
mkdir -p /tmp/site && cat /tmp/fi/part.* | xz -d -T8 | tar -C /tmp/site -xf -
say "unpacked: $?"
timeout 90 .carry/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/dk.json" > "$logs/bench.txt" 2>&1
say "bench: $(grep -h 'B=' "$logs/bench.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl > "$logs/pip.txt" 2>&1
PYTHONPATH=/tmp/fla-site:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages timeout 420 python3 -u tools/compare_fla_prefill.py \
  --skip-accuracy --flashinfer --deltakv-json "$logs/dk.json" --deltakv-bin .carry/deltakv \
  --csv "$out/prefill-vs-fla-fi.csv" > "$logs/fla-fi.txt" 2>&1
say "FLA + FlashInfer exit $? ($SECONDS s):"; tail -12 "$logs/fla-fi.txt" >> "$sum"
tar -czf "$out/logs.tar.gz" -C "$logs" .
