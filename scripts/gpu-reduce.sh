#!/usr/bin/env bash
# The invariant GEMM's cluster reduction (TcParams::cluster: the split slices of an output tile are
# one cluster and sum in distributed shared memory) on the device, against the reduction through
# L2, in one call of at most REDUCE_BUDGET seconds (default 570). REDUCES names the
# DSA_CUDA_GEMM_REDUCE values compared (default "auto global"; "cluster" forces it everywhere).
# Runs ON the device, from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}):
#   1. parity: every ParityGemm and ParityGemmW8a8 test (each reduction forced gives the default's
#      bits; ClusterReductionGivesTheBitsOfTheReductionThroughL2 at the V3.2 split shapes), the
#      graph tests, ParityFp8Rows and the GEMM ops (about 5 minutes: V32ProjectionsWithinTheBound
#      alone takes 2); REDUCE_PARITY names other tests, REDUCE_PARITY_S their limit (360 s);
#   2. the V3.2 layer's step (bench-decode, 1 layer, context 4096, graph replay, --gemm
#      invariant, --weights w8a8) at B = 1 / 8 / 64 / 256, each of REDUCES in turn, two rounds;
#   3. dsa_gpu_bench's GEMM rows on the wgmma kernel against cuBLASLt, each of REDUCES;
#   4. memcheck and racecheck over ParityGemmW8a8.SanitizerCompact (every tile and reduction);
#   5. check-replay --weights w8a8 (clean).
# Files in $OUT: summary.md, reduce.log, reduce-json.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup reduce.log "${REDUCE_BUDGET:-570}"
budgeted_parity "${REDUCE_PARITY_S:-360}" "$P" \
  --gtest_filter="${REDUCE_PARITY:-ParityGemm.*:ParityGemmW8a8.*:*ParityGraph*:ParityFp8Rows.*:ParityOps.Gemm*}" \
  --gtest_output="json:$OUT/parity.json"

V32=(bench-decode --backend cuda --preset v32 --layers 1 --context 4096 --iters 10
     --gemm invariant --weights w8a8 --batches 1 8 64 256)
read -r -a REDUCE_VALUES <<< "${REDUCES:-auto global}"
for round in 1 2; do
  for reduce in "${REDUCE_VALUES[@]}"; do
    budgeted "decode-$reduce-$round" 45 env DSA_CUDA_GEMM_REDUCE=$reduce "$DSA" "${V32[@]}" \
      --json "$OUT/decode-$reduce-$round.json"
  done
done
for reduce in "${REDUCE_VALUES[@]}"; do
  budgeted "gemm-bench-$reduce" 60 env DSA_CUDA_GEMM_REDUCE=$reduce "$B/bench/dsa_gpu_bench" \
    --skip-store --skip-attention --gemm-kernels wgmma --json "$OUT/gemm-$reduce.json"
done
for tool in memcheck racecheck; do
  budgeted "sanitizer-$tool" 60 "$SAN" --tool "$tool" --error-exitcode 17 --print-limit 30 \
    $([[ $tool == racecheck ]] && echo --racecheck-report all) "$P" \
    --gtest_filter='ParityGemmW8a8.SanitizerCompact' --gtest_brief=1
done
budgeted check-replay 90 "$DSA" --log error check-replay --backend cuda --weights w8a8 \
  --steps 1500 --seed 7

{
  steps_summary "The invariant GEMM's cluster reduction on the device"
  echo "## V3.2 decode step, w8a8, DSA_CUDA_GEMM_REDUCE = ${REDUCE_VALUES[*]}"
  echo
  python3 bench/gpu/decode_table.py "$OUT"
  for reduce in "${REDUCE_VALUES[@]}"; do
    echo
    echo "## GEMM, $reduce"
    echo
    log_section "gemm-bench-$reduce" |
      sed -n '/^gemm: invariant time \/ cuBLASLt time, wgmma/,/^(\* kKN/p' | sed 's/^/    /'
    log_section "gemm-bench-$reduce" |
      sed -n '/^gemm: fp8-weight invariant-w8a8 time/,/^(! after a ratio: the fp8/p' |
      sed 's/^/    /'
  done
  echo
  grep -E "verdict|CLEAN|CORRUPTION" "$LOG" | sed 's/^/    /'
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json reduce-json.tar.gz
