#!/usr/bin/env bash
# The invariant GEMM's tuning sweep. Runs ON the device, from the repository root, with the build
# of scripts/gpu-build.sh carried (build-gpu/{lib,bench,tests,dsa}); about 240 s in all, every
# step under `timeout`:
#   - the GEMM parity tests (ParityGemm.*: within the bound against the CPU, bitwise batch
#     invariance; ParityOps.GemmExactIsExact), on the default table;
#   - compute-sanitizer memcheck and racecheck over the small-shape GEMM tests (the fused split
#     reduction counts arrivals with atomics);
#   - dsa_gpu_bench --gemm-sweep: every tile configuration and split count of the invariant GEMM
#     on every V3.2 projection at B = 1, 8, 64, 256 against cuBLASLt, each run checked (nmse
#     against cuBLASLt, row 0 bit for bit against every run of the same split count), in the
#     time the earlier steps left (--gemm-sweep-budget). KERNEL=wgmma sweeps the wgmma kernel's
#     tiles (default: mma); the split counts swept are shared by both kernels. ONLY="q_a o ..."
#     sweeps those projections alone.
# Files in $OUT: sweep.log (everything), steps.tsv, parity.json, sweep.json, summary.md (the
# best configuration per projection and B, its ratio to cuBLASLt, and the kShapeTable lines to
# paste into src/backend/cuda/gemm_invariant.cu).
set -uo pipefail
cd "$(dirname "$0")/.."

TOTAL_S=${TOTAL_S:-240}
KERNEL=${KERNEL:-mma}

source scripts/gpu-steps.sh
steps_setup sweep.log

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
step parity 240 "$B/tests/dsa_parity_tests" \
  --gtest_filter='ParityGemm.*:ParityOps.GemmExactIsExact' --gtest_output="json:$OUT/parity.json"

SAN_FILTER='ParityGemm.RandomShapesWithinTheBound:ParityGemm.GivenBf16CopyGivesTheSameBits'
for tool in memcheck racecheck; do
  (( SECONDS > TOTAL_S - 90 )) && break  # the sweep comes first when time is short
  sanitize "sanitizer-$tool" "$tool" 60 "$B/tests/dsa_parity_tests" --gtest_filter="$SAN_FILTER" \
    --gtest_brief=1
done

# What is left, less the start (ceilings) and the summary: at least 40 s of sweeping.
budget=$(( TOTAL_S - SECONDS - 25 ))
(( budget < 40 )) && budget=40
step gemm-sweep $(( budget + 25 )) "$B/bench/dsa_gpu_bench" --skip-store --skip-attention \
  --gemm-sweep --gemm-sweep-kernel "$KERNEL" --gemm-sweep-budget "$budget" \
  ${ONLY:+--gemm-sweep-only $ONLY} \
  --json "$OUT/sweep.json"

{
  steps_summary "The invariant GEMM's sweep on the device"
  echo "## Per projection and B: cuBLASLt, the default table, the best checked run"
  echo
  grep -E "^  sweep |SWEEP CHECK FAILED" "$LOG" | sed 's/^  /    /'
  echo
  sed -n '/^gemm sweep: per projection/,/^$/p' "$LOG" | sed 's/^/    /'
  sed -n '/^gemm sweep: kShapeTable/,/^$/p' "$LOG" | sed 's/^/    /'
} > "$OUT/summary.md"
cat "$OUT/summary.md"
