#!/usr/bin/env bash
# The fp8-weight GEMM check, both kernels. Runs ON the device, from the repository root, with the
# build of scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}); about 5 minutes, every
# step under `timeout` (the timeouts sum to 590 s):
#   - parity: ParityGemmFp8w.* (fp8 weights give the bits of the same kernel on the dequantized
#     bf16 matrix: mma.sync, and the wgmma kernel's fp8 tiles wherever they run; every tile and
#     reduction; bitwise batch invariance of a probe row) and the bf16 GEMM's invariance test;
#   - compute-sanitizer memcheck and racecheck over the wgmma fp8 tiles' edge shapes;
#   - dsa_gpu_bench's GEMM rows (bf16 kernels, cuBLASLt, fp8 on mma.sync and on wgmma, each fp8
#     run checked bit for bit against its kernel's bf16 run; at B = 1 every wgmma fp8 tile by
#     name, the ones the default pick passes over included);
#   - bench-decode of one V3.2 layer: bf16 weights, then --weights fp8 on the wgmma fp8 tiles
#     (the mma.sync fp8 kernel's last step figures: bench/results/2026-12-04-h200-fp8w-run5-*).
# Files in $OUT: fp8w.log (everything), steps.tsv, parity.json, gemm_bench.json,
# decode_<case>.json, summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup fp8w.log

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
step parity 240 "$B/tests/dsa_parity_tests" \
  --gtest_filter='ParityGemmFp8w.*:ParityGemm.GivenBf16CopyGivesTheSameBits' \
  --gtest_output="json:$OUT/parity.json"

sanitize_parity 90 'ParityGemmFp8w.WgmmaFp8EdgeShapesGiveTheWgmmaBits'

step gemm-bench 100 "$B/bench/dsa_gpu_bench" --skip-store --skip-attention \
  --json "$OUT/gemm_bench.json"

# case: weights and DSA_CUDA_GEMM_FP8 (the fp8 weights' kernel under the default wgmma kernel).
for case in bf16 fp8-wgmma; do
  weights=bf16 fp8kernel=mma
  [[ $case == fp8-* ]] && weights=fp8 fp8kernel="${case#fp8-}"
  step "decode-$case" 30 env DSA_CUDA_GEMM_FP8="$fp8kernel" "$B/dsa" bench-decode --backend cuda \
    --preset v32 --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant \
    --weights "$weights" --json "$OUT/decode_$case.json"
done

{
  steps_summary "fp8 weights on the device"
  echo "## fp8 / bf16 of the same kernel, per projection"
  echo
  grep -E "FP8W BITS DIFFER|GEMM CHECK FAILED" "$LOG" | sed 's/^  /    /'
  sed -n '/^gemm: fp8-weight invariant/,/^(! after a ratio: the fp8/p' "$LOG" | sed 's/^/    /'
  echo
  echo "## every wgmma fp8 tile at B = 1 (fp8 / bf16 wgmma time; ! after a ratio: bits differ)"
  echo
  sed -n '/^gemm: fp8-weight wgmma time \/ bf16 wgmma time per fp8 tile/,/^(! after a ratio: the tile/p' "$LOG" |
    sed 's/^/    /'
  echo
  echo "## one V3.2 layer (bench-decode: B, eager ms, graph ms, ...)"
  echo
  for case in bf16 fp8-wgmma; do
    echo "    $case"
    awk -v n="=== decode-$case: " 'index($0, n) == 1 {on = !on} on' "$LOG" |
      grep -E "^ +(B|[0-9]+) " | sed 's/^/    /'
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
