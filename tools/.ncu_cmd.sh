set -x
.carry/deltakv bench gdn --device cuda --seq-lens 1 --decode-batches 1 > $OUT/bench.txt 2>&1
timeout 200 ncu -k regex:gdn_prefill -c 4 --section WarpStateStats --section SourceCounters --section SpeedOfLight --section MemoryWorkloadAnalysis .carry/deltakv bench gdn --device cuda --seq-lens 1 --decode-batches 1 > $OUT/ncu.txt 2>&1
echo rc=$?
