#!/usr/bin/env bash
# fp8 weights x fp8 activations (GemmParams::x_fp8, `--weights w8a8`, src/backend/cuda/
# gemm_w8a8.cu) on the device, in one call of about 6 minutes. Runs ON the device, from the
# repository root, with the build of scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}):
#   1. parity: ParityGemmW8a8.* (the CPU's definition within the e4m3 tensor core's bound and an
#      nmse, V3.2 and edge shapes; every tile and reduction the same bits; a probe row bitwise
#      invariant to its batch; refusals), and two of ParityGemmFp8w (the tensor-map change leaves
#      the fp8-weight tiles' bits alone);
#   2. memcheck over ParityGemmW8a8.SanitizerCompact (racecheck, synccheck and initcheck after
#      the check-replay of 5.);
#   3. dsa_gpu_bench's GEMM rows: bf16 on both kernels, cuBLASLt, fp8 weights on mma.sync and on
#      the wgmma fp8 tiles, and w8a8 (the quantizer included), per V3.2 projection and B;
#   4. the V3.2 layer's decode step (bench-decode, 1 layer, B = 1 / 8 / 64 / 256, graph replay)
#      with --weights bf16, fp8 (the wgmma fp8 tiles) and w8a8, and --profile of w8a8;
#   5. check-replay --weights w8a8 (graph against eager, the auditor; clean), and with the
#      incident's faults (found).
# W8A8_QUICK=1 (about 4 minutes): memcheck only, no profile, no incident replay. Every step has a timeout; the
# script goes on after a failure. Files in $OUT: summary.md, w8a8.log, parity.json,
# gemm_bench.json, decode_<weights>.json, profile_w8a8.json.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
# The whole script stays within W8A8_BUDGET seconds (default 540, under one device call's 600):
# budgeted steps (gpu-steps.sh) have their timeout cut to what is left.
budget_setup w8a8.log "${W8A8_BUDGET:-540}"
QUICK=${W8A8_QUICK:-0}

budgeted_parity 240 "$P" \
  --gtest_filter='ParityGemmW8a8.*:ParityGemmFp8w.WgmmaFp8EdgeShapesGiveTheWgmmaBits:ParityGemmFp8w.ProbeRowIsBitwiseInvariantToItsBatch' \
  --gtest_output="json:$OUT/parity.json"
sanitizers() {
  local tool extra
  for tool in "$@"; do
    extra=()
    [[ $tool == racecheck ]] && extra=(--racecheck-report all)
    budgeted "sanitizer-$tool" 90 "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 17 \
      --print-limit 30 "$P" --gtest_filter=ParityGemmW8a8.SanitizerCompact --gtest_brief=1
  done
}
sanitizers memcheck

budgeted gemm-bench 150 "$B/bench/dsa_gpu_bench" --skip-store --skip-attention \
  --json "$OUT/gemm_bench.json"

for weights in bf16 fp8 w8a8; do
  budgeted "decode-$weights" 40 env DSA_CUDA_GEMM_FP8=wgmma "$B/dsa" bench-decode --backend cuda \
    --preset v32 --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant \
    --weights "$weights" --json "$OUT/decode_$weights.json"
done
if [[ $QUICK != 1 ]]; then
  budgeted profile-w8a8 40 "$B/dsa" bench-decode --backend cuda --preset v32 --layers 1 --batches 1 \
    --context 4096 --iters 10 --gemm invariant --weights w8a8 --profile \
    --json "$OUT/profile_w8a8.json"
fi
budgeted check-replay 120 "$B/dsa" --log error check-replay --backend cuda --weights w8a8 \
  --steps 1500 --seed 7
[[ $QUICK != 1 ]] && sanitizers racecheck synccheck initcheck
if [[ $QUICK != 1 ]]; then
  # The incident's replay (exit 1 by design): expect_incident (gpu-steps.sh).
  budgeted check-replay-incident 120 bash -c 'expect_incident "$@"' _ "$B/dsa" --log error \
    check-replay --backend cuda --weights w8a8 --steps 1500 --seed 7 --inject incident
fi

{
  steps_summary "fp8 weights x fp8 activations on the device"
  echo "## GEMM: time / bf16 time (fp8w: the same kernel; w8a8: the bf16 wgmma), us / floor us"
  echo
  grep -E "W8A8 CHECK FAILED|FP8W BITS DIFFER|GEMM CHECK FAILED" "$LOG" | sed 's/^  /    /'
  sed -n '/^gemm: fp8-weight invariant/,/^(! after a ratio: the fp8/p' "$LOG" | sed 's/^/    /'
  sed -n '/^gemm: invariant time \/ cuBLASLt time, wgmma/,/^(\* kKN/p' "$LOG" | sed 's/^/    /'
  sed -n '/^gemm: w8a8 time \/ bf16 wgmma time per w8a8 tile/,/^(! after a ratio: the tile.s bits differ from the default/p' \
    "$LOG" | sed 's/^/    /'
  echo
  echo "## the parity tests' nmse against the CPU"
  echo
  grep -E "^w8a8 .*nmse" "$LOG" | sed 's/^/    /'
  echo
  echo "## one V3.2 layer (bench-decode: B, eager ms, graph ms, ...)"
  echo
  for weights in bf16 fp8 w8a8; do
    echo "    --weights $weights"
    awk -v n="=== decode-$weights: " 'index($0, n) == 1 {on = !on} on' "$LOG" |
      grep -E "^ +(B|[0-9]+) " | sed 's/^/    /'
  done
  echo
  awk -v n="=== profile-w8a8: " 'index($0, n) == 1 {on = !on} on' "$LOG" | sed 's/^/    /'
  grep -E "CLEAN|CORRUPTION" "$LOG" | sed 's/^/    /'
} > "$OUT/summary.md"
cat "$OUT/summary.md"
