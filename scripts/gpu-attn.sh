#!/usr/bin/env bash
# The attention kernels' GPU check: sparse MLA, top-k and indexer logits. Runs ON the device, from
# the repository root, with the build of scripts/gpu-build.sh carried (build-gpu/{lib,tests,
# bench,dsa}), in about 7 minutes (the step timeouts add up to 840 s):
#   the wgmma sparse MLA kernels first (DSA_CUDA_SPARSE_MLA_VARIANT=wgmma, and =wgmma64: the
#   64-token one): their parity, batch invariance (1 / 7 / 64 / 256 rows, and a padded graph
#   bucket against eager decode; wgmma64: 1 / 7 / 255), wgmma's two token-loop schedules bit for
#   bit, memcheck + racecheck over wgmma's compact case with the default schedule and with the
#   overlapped one forced (DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE=overlap), and over wgmma64's;
#   dsa_gpu_bench's attention rows (no store or GEMM rows; both sparse MLA kernels) and the torch
#   baselines, joined by report.py (before the longer checks, so a run cut short keeps them);
#   the other ParityAttention parity tests (CPU reference, guards, poison, batch invariance);
#   compute-sanitizer memcheck and racecheck over a short attention filter, and memcheck over a
#   graph-replayed decode (check-replay: captured decode steps, sparse MLA included).
# Every step has a timeout and the script goes on after a failure. Files in $OUT: summary.md
# (step table + bench report), attn.log, parity-wgmma.json, parity.json, bench.json,
# torch_attention.json.
# Environment: OUT (default ./gpu-out), SANITIZER_FILTER (gtest filter of the sanitizer runs).
set -uo pipefail
cd "$(dirname "$0")/.."

# The parity cases of the three kernels (every sparse MLA variant on a compact case, sliced and
# unsliced top-k rows, every indexer dtype); the batch-invariance families and the full sparse MLA
# table are too long under racecheck.
SANITIZER_FILTER="${SANITIZER_FILTER:-ParityAttention.SparseMlaVariantsCompact:ParityAttention.TopkMatchesCpuExactly:ParityAttention.IndexerLogitsMatchCpu}"

source scripts/gpu-steps.sh
steps_setup attn.log

step nvidia-smi 10 nvidia-smi
step parity-wgmma 75 "$B/tests/dsa_parity_tests" \
  --gtest_filter='ParityAttention.SparseMlaWgmma*:*WgmmaSparseMla*' \
  --gtest_output="json:$OUT/parity-wgmma.json"
sanitize sanitizer-memcheck-wgmma memcheck 40 "$B/tests/dsa_parity_tests" \
  --gtest_filter=ParityAttention.SparseMlaWgmmaCompact --gtest_brief=1
sanitize sanitizer-racecheck-wgmma racecheck 90 "$B/tests/dsa_parity_tests" \
  --gtest_filter=ParityAttention.SparseMlaWgmmaCompact --gtest_brief=1
sanitize sanitizer-memcheck-wgmma-overlap memcheck 30 "$B/tests/dsa_parity_tests" \
  --gtest_filter=ParityAttention.SparseMlaWgmmaOverlapCompact --gtest_brief=1
sanitize sanitizer-racecheck-wgmma-overlap racecheck 60 "$B/tests/dsa_parity_tests" \
  --gtest_filter=ParityAttention.SparseMlaWgmmaOverlapCompact --gtest_brief=1
sanitize sanitizer-memcheck-wgmma64 memcheck 40 "$B/tests/dsa_parity_tests" \
  --gtest_filter=ParityAttention.SparseMlaWgmma64Compact --gtest_brief=1
sanitize sanitizer-racecheck-wgmma64 racecheck 90 "$B/tests/dsa_parity_tests" \
  --gtest_filter=ParityAttention.SparseMlaWgmma64Compact --gtest_brief=1
step dsa_gpu_bench 90 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --json "$OUT/bench.json"
step torch_attention 45 python3 bench/gpu/torch_attention.py --json "$OUT/torch_attention.json"
step parity 120 "$B/tests/dsa_parity_tests" \
  --gtest_filter='ParityAttention.*:-ParityAttention.SparseMlaWgmma*' \
  --gtest_output="json:$OUT/parity.json"
sanitize sanitizer-memcheck memcheck 50 "$B/tests/dsa_parity_tests" \
  --gtest_filter="$SANITIZER_FILTER" --gtest_brief=1
sanitize sanitizer-racecheck racecheck 60 "$B/tests/dsa_parity_tests" \
  --gtest_filter="$SANITIZER_FILTER" --gtest_brief=1
sanitize sanitizer-memcheck-replay memcheck 40 \
  "$B/dsa" --log error check-replay --backend cuda --latent fp8 --index-k fp8 --steps 20 \
  --buckets 1 4 --no-parity
attention_summary "GPU attention check"
