#!/usr/bin/env bash
# Session 29, call 2: CUDA checkpoints stored by the overlapped state pass (the default walk)
# instead of the lockstep one. The CUDA checkpoint suite and the pooled/relayed prefill tests;
# `bench gdn --device cuda --checkpoint-every 1024` with this build and with call 1's
# (.carry/deltakv-base, checkpoints on the lockstep pass) in turn; memcheck over the checkpoint
# suite last. Carries .carry/deltakv, .carry/deltakv-base, .carry/tests.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
t=.carry/tests
"$t/deltakv-cuda-gdn_prefill_checkpoints" --test-threads=1 --nocapture >"$out/tests.txt" 2>&1
"$t/deltakv-cuda-gdn_prefill" pooled long_sequences --test-threads=1 --nocapture >>"$out/tests.txt" 2>&1
grep -E "test result|FAILED|panicked|worst [0-9.e-]+, all|drift|pooled" "$out/tests.txt" | sort | uniq -c | sort -rn | head -n 12
grep -hoE "worst [0-9.e-]+" "$out/tests.txt" | sort -t' ' -k2 -g | tail -n 1
for build in deltakv deltakv-base deltakv; do
    echo "== $build" | tee -a "$out/bench.txt"
    timeout 60 ".carry/$build" bench gdn --device cuda --seq-lens 1024 --checkpoint-every 1024 \
        --decode-batches 1 2>&1 | grep -E "ms|checkpoints" | tee -a "$out/bench.txt"
done
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$t/deltakv-cuda-gdn_prefill_checkpoints" --test-threads=1 >"$out/memcheck.txt" 2>&1
echo "memcheck exit $?"
grep -E "ERROR SUMMARY|test result" "$out/memcheck.txt"
