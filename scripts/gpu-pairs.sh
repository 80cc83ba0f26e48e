#!/usr/bin/env bash
# The invariant GEMM's pair tiles (gemm_wgmma_tma.cu's .mc2 tiles: the two CTAs of a cluster
# along the features share each x tile through multicast copies, halving a large tile's x traffic
# from L2) on the device, in one call of at most PAIRS_BUDGET seconds (default 540). Runs ON the
# device, from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}):
#   1. parity: the pair tiles run paired with the default's bits (PairTilesRunPairedWithTheDefaultBits),
#      every tile and reduction, the kKN tiles (pairs among them), the probe row, the cluster
#      reduction;
#   2. memcheck, racecheck and synccheck over ParityGemm.PairTilesSanitizerCompact; check-replay
#      (bf16 and fp8 index-K, CLEAN) and its incident (CORRUPTION FOUND) with this build's defaults;
#   3. the tile sweep of the V3.2 projections at their table split counts
#      (dsa_gpu_bench --gemm-sweep --gemm-sweep-kernel wgmma --gemm-sweep-default-splits), which
#      times every bulk-copy tile, pairs included, against cuBLASLt at B = 1, 8, 64, 256 and prints
#      the best tile per class of m;
#   4. the V3.2 step (bench-decode, w8a8 and bf16 weights, 1 layer, context 4096, graph replay) at
#      B = 1, 8, 64 and 256 with the defaults, for the table the sweep may change.
# Files in $OUT: summary.md, pairs.log, pairs-json.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup pairs.log "${PAIRS_BUDGET:-540}"
budgeted_parity "${PAIRS_PARITY_S:-200}" "$P" \
  --gtest_filter="${PAIRS_PARITY:-ParityGemm.PairTiles*:ParityGemm.ConstantWeightsUnderPdlSeeTheirProducersOutput:ParityGemm.EveryTileAndReductionGiveTheSameBits:ParityGemm.KnWeightsOnWgmmaTiles*:ParityGemm.ProbeRowIsBitwiseInvariantToItsBatch:ParityGemm.ClusterReductionGivesTheBitsOfTheReductionThroughL2}" \
  --gtest_output="json:$OUT/parity.json"
for tool in memcheck racecheck synccheck; do
  budgeted "sanitizer-$tool" 60 "$SAN" --tool "$tool" --error-exitcode 17 --print-limit 30 \
    $([[ $tool == racecheck ]] && echo --racecheck-report all) "$P" \
    --gtest_filter='ParityGemm.PairTilesSanitizerCompact' --gtest_brief=1
done
# The replay check with this build's defaults (both index-K dtypes), and the incident found.
for k in bf16 fp8; do
  budgeted "check-replay-$k" 90 "$DSA" --log error check-replay --backend cuda --index-k "$k" \
    --steps 1500 --seed 7
done
budgeted check-replay-incident 90 bash -c 'expect_incident "$@"' _ "$DSA" --log error \
  check-replay --backend cuda --steps 600 --seed 7 --inject incident
# The sweep gets what is left but the decode steps' 130 s, at most PAIRS_SWEEP_S (200).
sweep_s=$(( DEADLINE - SECONDS - 130 ))
(( sweep_s > ${PAIRS_SWEEP_S:-200} )) && sweep_s=${PAIRS_SWEEP_S:-200}
budgeted sweep "$sweep_s" "$B/bench/dsa_gpu_bench" --skip-store --skip-attention \
  --gemm-sweep --gemm-sweep-kernel wgmma --gemm-sweep-default-splits \
  --gemm-sweep-budget "$(( sweep_s > 40 ? sweep_s - 20 : 20 ))" --json "$OUT/sweep.json"
for weights in w8a8 bf16; do
  budgeted "decode-$weights" 60 "$DSA" bench-decode --backend cuda --preset v32 --layers 1 \
    --context 4096 --iters 10 --gemm invariant --weights "$weights" --batches 1 8 64 256 \
    --json "$OUT/decode-$weights.json"
done

{
  steps_summary "The invariant GEMM's pair tiles on the device"
  echo "## The sweep (best tile per projection and B, at the table's split count)"
  echo
  log_section sweep | grep -E "^  sweep |^gemm sweep|^[a-z_]+ +[0-9]+ " | sed 's/^/    /'
  echo
  grep -E "verdict|CLEAN|CORRUPTION" "$LOG" | sed 's/^/    /'
  echo
  echo "## V3.2 decode step, B = 1, 8, 64 and 256"
  echo
  python3 bench/gpu/decode_table.py "$OUT"
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json pairs-json.tar.gz
