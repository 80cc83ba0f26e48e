#!/usr/bin/env bash
# The GEMM check. Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}); at most 10 minutes in all (the
# steps' timeouts sum to 595 s; about 5 minutes when nothing times out):
#   - the GEMM parity tests (both invariant kernels, mma.sync and wgmma, each within its bound
#     and bitwise batch-invariant, and kKN weights on the wgmma tiles; the exact one
#     bit-identical to the CPU, cuBLASLt within bf16 tolerance, the MoE MLP);
#   - compute-sanitizer memcheck and racecheck over the small-shape GEMM tests (the kKN wgmma
#     tiles' included);
#   - dsa_gpu_bench's GEMM rows: every V3.2 projection at B = 1, 8, 64, 256, both invariant
#     kernels (and kv_b absorb on the wgmma kKN tiles) vs cuBLASLt in the same run, each checked
#     against cuBLASLt's output, with the bytes / bandwidth floor;
#   - bench-decode of one V3.2 layer at --gemm invariant with each kernel and --gemm fast (exact,
#     3.3 ms at B = 1 on 2026-12-04, is left out for the sanitizers' time).
# Files in $OUT: gemm.log (everything), steps.tsv, parity.json, gemm_bench.json,
# decode_<mode>.json, summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup gemm.log

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
PARITY_FILTER='ParityGemm.*:ParityOps.GemmExactIsExact:ParityOps.GemmFast*:ParityOps.NormBf16*:ParityMoe.MoeMlp*'
step parity 250 "$B/tests/dsa_parity_tests" --gtest_filter="$PARITY_FILTER" \
  --gtest_output="json:$OUT/parity.json"

sanitize_parity 90 'ParityGemm.RandomShapesWithinTheBound:ParityGemm.GivenBf16CopyGivesTheSameBits:ParityGemm.KnWeightsOnWgmmaTiles'

step gemm-bench 80 "$B/bench/dsa_gpu_bench" --skip-store --skip-attention \
  --json "$OUT/gemm_bench.json"

# invariant-KERNEL: --gemm invariant with DSA_CUDA_GEMM=KERNEL.
for mode in invariant-mma invariant-wgmma fast; do
  kernel=mma
  [[ $mode == invariant-* ]] && kernel="${mode#invariant-}"
  step "decode-$mode" 25 env DSA_CUDA_GEMM="$kernel" "$B/dsa" bench-decode --backend cuda \
    --preset v32 --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm "${mode%%-*}" \
    --json "$OUT/decode_$mode.json"
done

{
  steps_summary "GEMM on the device"
  echo "## invariant / cuBLASLt, per kernel"
  echo
  grep -E "GEMM CHECK FAILED" "$LOG" | sed 's/^  /    /'
  sed -n '/^gemm: invariant time/,/^(! after/p' "$LOG" | sed 's/^/    /'
  echo
  echo "## one V3.2 layer (bench-decode: B, eager ms, graph ms, ...)"
  echo
  for mode in invariant-mma invariant-wgmma fast; do
    echo "    $mode"
    awk -v n="=== decode-$mode: " 'index($0, n) == 1 {on = !on} on' "$LOG" |
      grep -E "^ +(B|[0-9]+) " | sed 's/^/    /'
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
