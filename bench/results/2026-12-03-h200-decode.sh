#!/usr/bin/env bash
# Decode-step before/after, per-op profiles, parity and stress on the device. Run from .perf/.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a $LOG
run() {
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a $LOG
  local t0=$SECONDS
  timeout --kill-after=5 $limit "$@" 2>&1 | tee -a $LOG
  echo "=== $name rc=${PIPESTATUS[0]} in $((SECONDS - t0))s" | tee -a $LOG
}
V32="--backend cuda --preset v32 --layers 1 --batches 1 64 256 --context 4096 --iters 10"
TINY="--backend cuda --preset tiny --layers 0 --batches 1 8 64 256 --context 1000 --iters 20"
run base-v32-invariant 90 ./base/dsa bench-decode $V32 --gemm invariant
run base-v32-fast 60 ./base/dsa bench-decode $V32 --gemm fast
run base-tiny 60 ./base/dsa bench-decode $TINY
run new-v32-invariant 120 ./dsa bench-decode $V32 --gemm invariant --profile --json $OUT/v32_invariant.json
run new-v32-fast 90 ./dsa bench-decode $V32 --gemm fast --profile --json $OUT/v32_fast.json
nvidia-smi dmon -s pc -d 1 > $OUT/dmon_tiny.txt 2>&1 &
DMON=$!
run new-tiny 60 ./dsa bench-decode $TINY --profile --json $OUT/tiny.json
run new-tiny-long 60 ./dsa bench-decode --backend cuda --preset tiny --layers 0 --batches 1 --context 1000 --iters 2000
kill $DMON
cat $OUT/dmon_tiny.txt | tee -a $LOG
run parity 150 ./dsa_parity_tests
run racecheck-sample 60 compute-sanitizer --tool racecheck --racecheck-report hazard ./dsa_parity_tests --gtest_filter='ParitySample.ManySeedsAgree'
run memcheck-sample 90 compute-sanitizer --tool memcheck ./dsa_parity_tests --gtest_filter='ParitySample.DrawsTheCpuTokensExactly'
run stress-graph 120 ./dsa stress --backend cuda --sessions 60 --concurrency 60 --index-k bf16 --mode graph --faults guarded --quiet --json $OUT/stress.json
run stress-noaudit 90 ./dsa stress --backend cuda --sessions 60 --concurrency 60 --index-k bf16 --mode all --faults guarded --quiet --no-audit --no-reference
grep -E "^=== .* rc=" $LOG
