#!/bin/bash
# Session 24, call 6 (11e1c76's binary, .carry/deltakv, row 45): `bench gdn` and FLA 0.6 beside
# it in the same call (tools/compare_fla_prefill.py, speed only) for the README's table.
out=${OUT:?}; cd "$(dirname "$0")/../.." || exit 1
logs=$(mktemp -d); sum=$out/summary.txt
say() { echo "$*" >> "$sum"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 150 .carry/deltakv bench gdn --device cuda --seq-lens 1024 --decode-batches 1 --json "$logs/new.json" > "$logs/bench-new.txt" 2>&1
say "new exit $?: $(grep -h 'B=' "$logs/bench-new.txt" | grep -v pool | awk '{print $1,$2,$3,$6}' | tr '\n' ';')"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla-site .whl/*.whl > "$logs/pip.txt" 2>&1
PYTHONPATH=/tmp/fla-site timeout 400 python3 -u tools/compare_fla_prefill.py --skip-accuracy \
  --deltakv-json "$logs/new.json" --deltakv-bin .carry/deltakv --csv "$out/prefill-vs-fla.csv" --plot "$out/prefill-vs-fla.png" > "$logs/fla-speed.txt" 2>&1
say "FLA speed exit $? ($SECONDS s):"; tail -8 "$logs/fla-speed.txt" >> "$sum"
tar -czf "$out/logs.tar.gz" -C "$logs" .
