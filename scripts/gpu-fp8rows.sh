#!/usr/bin/env bash
# The producers' fp8 rows (Fp8Rows, ops.h: RMSNorm and SwiGLU quantize what they write for the
# w8a8 GEMM that reads it next, which then skips its own quantizer kernel) on the device, in one
# call of about 4 minutes. Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}); OLD=DIR names an earlier
# build's dsa binary (DIR/build-gpu/dsa) to time in the same call, the baseline:
#   1. parity: ParityFp8Rows.* (the encoder's bytes and scales of the op's own output, the GEMM
#      given them the same bits), ParityGemmW8a8.*, ParityOps.* (the norms' parts change);
#   2. memcheck, racecheck and initcheck over ParityFp8Rows.*;
#   3. the V3.2 layer's step with --weights w8a8 (B = 1 / 8 / 64 / 256, graph), this build and
#      OLD's, alternately, with the default sparse MLA and with hn at 8 splits; --profile at B = 1;
#   4. check-replay --weights w8a8: clean, and the incident found.
# Files in $OUT: summary.md, fp8rows.log, fp8rows-json.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup fp8rows.log "${FP8ROWS_BUDGET:-540}"
budgeted_parity 180 "$P" --gtest_filter='ParityFp8Rows.*:ParityGemmW8a8.*:ParityOps.*' \
  --gtest_output="json:$OUT/parity.json"
for tool in memcheck racecheck initcheck; do
  extra=()
  [[ $tool == racecheck ]] && extra=(--racecheck-report all)
  budgeted "sanitizer-$tool" 90 "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 17 \
    --print-limit 30 "$P" --gtest_filter='ParityFp8Rows.*' --gtest_brief=1
done

V32=(bench-decode --backend cuda --preset v32 --layers 1 --context 4096 --iters 10
     --gemm invariant --weights w8a8)
for round in 1 2; do
  for build in new old; do
    dsa="$B/dsa"
    if [[ $build == old ]]; then
      [[ -n ${OLD:-} && -x $OLD/build-gpu/dsa ]] || continue
      dsa="$OLD/build-gpu/dsa"
    fi
    budgeted "decode-$build-$round" 45 "$dsa" "${V32[@]}" --batches 1 8 64 256 \
      --json "$OUT/decode-$build-$round.json"
    budgeted "decode-$build-hn8-$round" 30 env DSA_CUDA_SPARSE_MLA_VARIANT=hn \
      DSA_CUDA_SPARSE_MLA_MAX_SPLITS=8 "$dsa" "${V32[@]}" --batches 1 \
      --json "$OUT/decode-$build-hn8-$round.json"
  done
done
budgeted profile 40 "$B/dsa" "${V32[@]}" --batches 1 --profile --json "$OUT/profile.json"
budgeted check-replay 120 "$B/dsa" --log error check-replay --backend cuda --weights w8a8 \
  --steps 1500 --seed 7
budgeted check-replay-incident 120 bash -c 'expect_incident "$@"' _ "$B/dsa" --log error \
  check-replay --backend cuda --weights w8a8 --steps 1500 --seed 7 --inject incident

{
  steps_summary "fp8 rows from the producers, on the device"
  echo "## V3.2 step, --weights w8a8"
  echo
  python3 bench/gpu/decode_table.py "$OUT"
  echo
  log_section profile | grep -vE "^===" | sed 's/^/    /'
  grep -E "verdict" "$LOG" | sed 's/^/    /'
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json fp8rows-json.tar.gz
