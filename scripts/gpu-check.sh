#!/usr/bin/env bash
# The whole-change check in two parts of at most 10 minutes each (one device command each). Runs
# ON the device, from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}). Every step has a timeout; the script goes on after a failure.
#   PART=parity (default): every CUDA parity family against the CPU reference (GEMM, attention,
#     the rest), then compute-sanitizer memcheck and racecheck over the default kernels' compact
#     cases (sparse MLA wgmma, indexer wgmma, the small ops: $SMALL_FILTER) and the wgmma64
#     sparse MLA kernel's, memcheck over a graph-replayed decode; files parity-*.json, check.log,
#     summary.md.
#   PART=bench: dsa_gpu_bench's attention rows (sparse MLA and indexer variants side by side) and
#     GEMM rows (invariant vs cuBLASLt per V3.2 projection), then bench-decode of one V3.2 layer
#     (--gemm invariant with --profile, and --gemm fast) and of the tiny preset, then the V3.2
#     two-layer stress at concurrency 60; files bench-*.json, decode-*.json, stress-v32.json,
#     check.log, summary.md.
# Environment: OUT (default ./gpu-out), PART, GEMM_FILTER (default ParityGemm.*), SMALL_FILTER (gtest filter of the small ops' cases
# for the sanitizers), EXTRA_VARIANTS (more indexer variants for the bench rows and the indexer's
# sanitizer steps, comma-separated).
set -uo pipefail
cd "$(dirname "$0")/.."

PART=${PART:-parity}
SMALL_FILTER=${SMALL_FILTER:-ParityOps.RmsNorm:ParityOps.LayerNorm:ParityOps.Rope:ParityOps.Hadamard:ParityOps.Embed}
source scripts/gpu-steps.sh
steps_setup "check-$PART.log"
P="$B/tests/dsa_parity_tests"

if [[ $PART == parity ]]; then
  step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  step parity-gemm 200 "$P" --gtest_filter="${GEMM_FILTER:-ParityGemm.*}" \
    --gtest_output="json:$OUT/parity-gemm.json"
  step parity-attention 150 "$P" --gtest_filter='ParityAttention.*' \
    --gtest_output="json:$OUT/parity-attention.json"
  step parity-mla-overlap 100 env DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE=overlap "$P" \
    --gtest_filter='ParityAttention.SparseMlaWgmmaMatchesCpu:ParityAttention.SparseMlaWgmmaBatchInvariant:*WgmmaSparseMla*' \
    --gtest_output="json:$OUT/parity-mla-overlap.json"
  step parity-rest 150 "$P" --gtest_filter='-ParityGemm.*:ParityAttention.*' \
    --gtest_output="json:$OUT/parity-rest.json"
  sanitize memcheck-mla memcheck 40 "$P" --gtest_filter=ParityAttention.SparseMlaWgmmaCompact --gtest_brief=1
  sanitize racecheck-mla racecheck 50 "$P" --gtest_filter=ParityAttention.SparseMlaWgmmaCompact \
    --gtest_brief=1
  sanitize memcheck-indexer memcheck 30 env DSA_CUDA_INDEXER_VARIANT=wgmma "$P" \
    --gtest_filter=ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike --gtest_brief=1
  sanitize racecheck-indexer racecheck 40 env DSA_CUDA_INDEXER_VARIANT=wgmma "$P" \
    --gtest_filter=ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike --gtest_brief=1
  sanitize memcheck-mla-overlap memcheck 40 "$P" \
    --gtest_filter=ParityAttention.SparseMlaWgmmaOverlapCompact --gtest_brief=1
  sanitize racecheck-mla-overlap racecheck 50 "$P" \
    --gtest_filter=ParityAttention.SparseMlaWgmmaOverlapCompact --gtest_brief=1
  sanitize memcheck-mla64 memcheck 40 "$P" --gtest_filter=ParityAttention.SparseMlaWgmma64Compact \
    --gtest_brief=1
  sanitize racecheck-mla64 racecheck 90 "$P" --gtest_filter=ParityAttention.SparseMlaWgmma64Compact \
    --gtest_brief=1
  for v in ${EXTRA_VARIANTS//,/ }; do
    sanitize "memcheck-indexer-$v" memcheck 30 env DSA_CUDA_INDEXER_VARIANT="$v" "$P" \
      --gtest_filter=ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike --gtest_brief=1
    sanitize "racecheck-indexer-$v" racecheck 40 env DSA_CUDA_INDEXER_VARIANT="$v" "$P" \
      --gtest_filter=ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike --gtest_brief=1
  done
  sanitize memcheck-small memcheck 40 "$P" --gtest_filter="$SMALL_FILTER" --gtest_brief=1
  sanitize racecheck-small racecheck 40 "$P" --gtest_filter="$SMALL_FILTER" --gtest_brief=1
  sanitize memcheck-replay memcheck 40 "$B/dsa" --log error check-replay --backend cuda --latent fp8 \
    --index-k fp8 --steps 20 --buckets 1 4 --no-parity
else
  G="$B/bench/dsa_gpu_bench"
  step bench-attention 90 "$G" --skip-store --skip-gemm --attention-only sparse_mla indexer_logits \
    --indexer-variants "legacy,wgmma${EXTRA_VARIANTS:+,$EXTRA_VARIANTS}" --indexer-rows 1 64 256 \
    --json "$OUT/bench-attention.json"
  step bench-gemm 90 "$G" --skip-store --skip-attention --json "$OUT/bench-gemm.json"
  step decode-v32-invariant 90 "$B/dsa" bench-decode --backend cuda --preset v32 --layers 1 \
    --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant --profile \
    --json "$OUT/decode-v32-invariant.json"
  step decode-v32-fast 40 "$B/dsa" bench-decode --backend cuda --preset v32 --layers 1 \
    --batches 1 8 64 256 --context 4096 --iters 10 --gemm fast --json "$OUT/decode-v32-fast.json"
  step decode-tiny 40 "$B/dsa" bench-decode --backend cuda --preset tiny --layers 0 \
    --batches 1 8 64 256 --context 1000 --iters 20 --json "$OUT/decode-tiny.json"
  step stress-v32 120 "$B/dsa" stress --backend cuda --preset v32 --layers 2 --sessions 60 \
    --concurrency 60 --index-k all --json "$OUT/stress-v32.json"
fi
steps_summary "GPU check ($PART)" > "$OUT/summary.md"
cat "$OUT/summary.md"
