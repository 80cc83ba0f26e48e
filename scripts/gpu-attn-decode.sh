#!/usr/bin/env bash
# The attention kernels' check and their place in the decode step, in one device command of
# under 10 minutes: scripts/gpu-attn.sh (parity of every attention family, the sanitizers, the
# bench rows beside torch), the indexer rows per block size (DSA_CUDA_INDEXER_BLOCK_TOKENS = 128
# .. 1024, B = 1 at L = 128K and B = 64 at L = 32K), then one V3.2 layer's decode step (graph
# replay, context 4096, the per-op profile) with bf16 and with fp8 caches. Runs ON the device,
# from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}). Everything lands in $OUT/attn-decode.tar.gz (the device
# returns at most 8 files) beside summary.md.
# Environment: OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$PWD/gpu-out}"
W="$OUT/work"
mkdir -p "$W"
OUT="$W/attn" bash scripts/gpu-attn.sh > /dev/null 2>&1

source scripts/gpu-steps.sh
OUT="$W" steps_setup decode.log
for tokens in 128 256 512 1024; do
  step "indexer-$tokens" 40 env DSA_CUDA_INDEXER_BLOCK_TOKENS="$tokens" \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
    --indexer-rows 1 64 --json "$W/indexer-$tokens.json"
done
for caches in bf16 fp8; do
  step "decode-$caches" 90 "$B/dsa" bench-decode --backend cuda --preset v32 --layers 1 \
    --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant --latent "$caches" \
    --index-k "$caches" --profile --json "$W/decode-$caches.json"
done
{
  cat "$W/attn/summary.md"
  steps_summary "indexer block sizes and the decode step"
} > "$OUT/summary.md"
tar -czf "$OUT/attn-decode.tar.gz" -C "$W" .
rm -rf "$W"
cat "$OUT/summary.md"
