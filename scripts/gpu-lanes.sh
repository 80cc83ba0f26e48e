#!/usr/bin/env bash
# The step's lanes (Backend::set_lane: the stores and the indexer on a second stream, beside the
# query projections, a parallel branch of the captured graph) on the device, in one call of at
# most LANES_BUDGET seconds (default 540; about 5 minutes). Runs ON the device, from the
# repository root, with the build of scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}):
#   1. parity: every ParityGraph test (graph against eager with the lanes on;
#      LanesGiveTheBitsOfOneStream: DSA_CUDA_LANES=on against off, with and without PDL),
#      ParityFp8Rows.*, ParityGemmW8a8.*; memcheck over the lanes test;
#   2. the V3.2 layer's step (bench-decode, 1 layer, context 4096, graph replay, --gemm
#      invariant, --weights w8a8: its indexer weights GEMM runs on the side lane) at B = 1 / 8 /
#      64 / 256 with the lanes on and off, alternately, two rounds, and with hn at 8 splits at
#      B = 1; the tiny preset's, graph against eager;
#   3. check-replay --weights w8a8 (clean) and with the incident (found);
#   4. --profile of the w8a8 step at B = 1 (every op on the main lane while it records).
# Files in $OUT: summary.md, lanes.log, lanes-json.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup lanes.log "${LANES_BUDGET:-540}"
budgeted_parity 200 "$P" --gtest_filter='*ParityGraph*:ParityFp8Rows.*:ParityGemmW8a8.*' \
  --gtest_output="json:$OUT/parity.json"
budgeted sanitizer-memcheck 120 "$SAN" --tool memcheck --error-exitcode 17 --print-limit 30 "$P" \
  --gtest_filter='*ParityGraph.LanesGiveTheBitsOfOneStream*' --gtest_brief=1

V32=(bench-decode --backend cuda --preset v32 --layers 1 --context 4096 --iters 10
     --gemm invariant --weights w8a8)
for round in 1 2; do
  for lanes in on off; do
    budgeted "decode-lanes-$lanes-$round" 45 env DSA_CUDA_LANES=$lanes "$DSA" "${V32[@]}" \
      --batches 1 8 64 256 --json "$OUT/decode-lanes-$lanes-$round.json"
    budgeted "decode-hn8-lanes-$lanes-$round" 30 env DSA_CUDA_LANES=$lanes \
      DSA_CUDA_SPARSE_MLA_VARIANT=hn DSA_CUDA_SPARSE_MLA_MAX_SPLITS=8 "$DSA" "${V32[@]}" \
      --batches 1 --json "$OUT/decode-hn8-lanes-$lanes-$round.json"
  done
done
for lanes in on off; do
  budgeted "tiny-$lanes" 40 env DSA_CUDA_LANES=$lanes "$DSA" bench-decode --backend cuda \
    --preset tiny --layers 0 --batches 1 8 64 256 --context 1000 --iters 200 \
    --json "$OUT/tiny-$lanes.json"
done
budgeted check-replay 90 "$DSA" --log error check-replay --backend cuda --weights w8a8 \
  --steps 1500 --seed 7
budgeted check-replay-incident 90 bash -c 'expect_incident "$@"' _ "$DSA" --log error \
  check-replay --backend cuda --weights w8a8 --steps 1500 --seed 7 --inject incident
budgeted profile 40 "$DSA" "${V32[@]}" --batches 1 --profile --json "$OUT/profile.json"

{
  steps_summary "The step's lanes on the device"
  echo "## Decode steps, lanes on and off"
  echo
  python3 bench/gpu/decode_table.py "$OUT"
  echo
  python3 bench/gpu/decode_table.py --eager --prefix tiny- "$OUT"
  echo
  log_section profile | grep -vE "^===" | sed 's/^/    /'
  grep -E "verdict|CLEAN|CORRUPTION" "$LOG" | sed 's/^/    /'
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json lanes-json.tar.gz
