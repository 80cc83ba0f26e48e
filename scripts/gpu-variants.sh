#!/usr/bin/env bash
# The opt-in variants that have not yet run on a GPU, checked and timed in one device command of
# under 10 minutes: the 64-token sparse MLA kernel (DSA_CUDA_SPARSE_MLA_VARIANT=wgmma64) and fp8
# weights with 128 x 128 block scales in the invariant GEMM (--weights fp8). Runs ON the device,
# from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}). Every step has a timeout; the script goes on after a failure,
# the parity and sanitizer steps first so a run cut short still says whether the variants are
# correct. Files in $OUT: variants.log (every step's output), parity-*.json, bench-*.json,
# decode-*.json, summary.md.
#   1. parity: ParityAttention.SparseMlaWgmma64* (CPU bound, ragged topk, compact, bitwise batch
#      invariance); ParityGemmFp8w.* (fp8 weights give the bf16 GEMM's bits on the dequantized
#      matrix, every tile and reduction, the probe row alone / among 7 / among 255), and the bf16
#      GEMM's own invariance test (its kernel gained the fp8 instantiation).
#   2. memcheck and racecheck over both variants' compact cases.
#   3. dsa_gpu_bench: the sparse MLA rows (/wgmma64 beside /wgmma and the default) and the GEMM
#      rows (gemm/invariant-fp8w/... beside the bf16 invariant kernel and cuBLASLt).
#   4. bench-decode of one V3.2 layer, --weights bf16 and fp8, with the per-op profile; and with
#      the wgmma64 kernel.
# Environment: OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup variants.log
P="$B/tests/dsa_parity_tests"
G="$B/bench/dsa_gpu_bench"

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
step parity-mla64 90 "$P" --gtest_filter='ParityAttention.SparseMlaWgmma64*' \
  --gtest_output="json:$OUT/parity-mla64.json"
step parity-fp8w 150 "$P" \
  --gtest_filter='ParityGemmFp8w.*:ParityGemm.ProbeRowIsBitwiseInvariantToItsBatch' \
  --gtest_output="json:$OUT/parity-fp8w.json"
sanitize memcheck-mla64 memcheck 40 "$P" --gtest_filter=ParityAttention.SparseMlaWgmma64Compact \
  --gtest_brief=1
sanitize racecheck-mla64 racecheck 50 "$P" \
  --gtest_filter=ParityAttention.SparseMlaWgmma64Compact --gtest_brief=1
sanitize memcheck-fp8w memcheck 60 "$P" --gtest_filter=ParityGemmFp8w.OddShapesMatchBf16Bits \
  --gtest_brief=1
step bench-mla 60 "$G" --skip-store --skip-gemm --attention-only sparse_mla \
  --json "$OUT/bench-mla.json"
step bench-gemm 120 "$G" --skip-store --skip-attention --gemm-kernels mma \
  --json "$OUT/bench-gemm.json"
decode() {  # decode NAME MLA_VARIANT WEIGHTS: one V3.2 layer, context 4096, graph replay
  step "decode-$1" 80 env DSA_CUDA_SPARSE_MLA_VARIANT="$2" "$B/dsa" bench-decode --backend cuda \
    --preset v32 --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant \
    --weights "$3" --profile --json "$OUT/decode-$1.json"
}
decode fp8w wgmma fp8
decode mla64 wgmma64 bf16
decode bf16 wgmma bf16
steps_summary "opt-in variants" > "$OUT/summary.md"
cat "$OUT/summary.md"
