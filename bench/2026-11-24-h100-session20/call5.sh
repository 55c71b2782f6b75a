#!/bin/bash
# Session 20, call 5: FLA 0.6 beside 9c9d4f9's binary (.carry/deltakv; call 4 timed FLA out):
# bench gdn at four lengths, FLA's speed and accuracy on the same shapes and inputs, then the
# L2-prefetching prepare (DELTAKV_PREFILL_PREPARE=mma-prefetch) beside the default.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
b() { local name=$1 bin=$2; shift 2
  env "$@" timeout 90 .carry/$bin bench gdn --device cuda --seq-lens "${SEQ:-1024}" --decode-batches 1 --json "$logs/$name.json" > "$logs/bench-$name.txt" 2>&1
  say "$name: $(grep -h 'B=' "$logs/bench-$name.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
}
SEQ=1024,4096,16384,65536 b new deltakv
cp "$logs/new.json" "$out/deltakv.json"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl > "$logs/pip.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 300 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
  --deltakv-json "$logs/new.json" --deltakv-bin .carry/deltakv --csv "$out/prefill-vs-fla.csv" \
  --plot "$out/prefill-vs-fla.png" > "$logs/fla-speed.txt" 2>&1
say "FLA speed exit $? ($SECONDS s):"; tail -20 "$logs/fla-speed.txt" >> "$sum"
if [ "$SECONDS" -lt 420 ]; then
  PYTHONPATH=/tmp/fla-site timeout $((520 - SECONDS)) python3 -u tools/compare_fla_prefill.py --skip-speed \
    --deltakv-json "$logs/new.json" --deltakv-bin .carry/deltakv > "$logs/fla-accuracy.txt" 2>&1
  say "FLA accuracy exit $? ($SECONDS s):"; tail -14 "$logs/fla-accuracy.txt" >> "$sum"
else say "FLA accuracy: skipped (time)"; fi
if [ "$SECONDS" -lt 500 ]; then b prefetch deltakv DELTAKV_PREFILL_PREPARE=mma-prefetch; b default deltakv; fi
tar -czf "$out/logs.tar.gz" -C "$logs" .
