#!/usr/bin/env bash
# The quick check of the top-k and indexer-logits kernels, old against new in one process. Runs ON
# the device, from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}), in under 200 s (the step timeouts add up to 200 s):
#   the top-k and indexer parity tests (every gathering variant, the legacy kernel, guards);
#   compute-sanitizer memcheck over the top-k parity cases of moderate size;
#   dsa_gpu_bench's top-k and indexer rows, each beside its former kernel (rows *_legacy/...:
#   DSA_CUDA_TOPK=legacy, DSA_CUDA_INDEXER_VARIANT=legacy), and the torch baselines of the same
#   rows, joined by report.py.
# Every step has a timeout and the script goes on after a failure. Files in $OUT: summary.md,
# sweep.log, parity.json, bench.json, torch_attention.json, report.md.
set -uo pipefail
cd "$(dirname "$0")/.."

FAMILIES=topk,indexer_logits

source scripts/gpu-steps.sh
steps_setup sweep.log

step nvidia-smi 5 nvidia-smi
step parity 50 "$B/tests/dsa_parity_tests" \
  --gtest_filter='ParityAttention.Topk*:ParityAttention.IndexerLogits*' \
  --gtest_output="json:$OUT/parity.json"
sanitize sanitizer-memcheck memcheck 40 \
  "$B/tests/dsa_parity_tests" --gtest_filter='ParityAttention.TopkMatchesCpuExactly' \
  --gtest_brief=1
step dsa_gpu_bench 70 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm \
  --attention-only "$FAMILIES" --legacy --json "$OUT/bench.json"
step torch_attention 30 python3 bench/gpu/torch_attention.py --only "$FAMILIES" \
  --json "$OUT/torch_attention.json"
attention_summary "GPU top-k and indexer sweep"
