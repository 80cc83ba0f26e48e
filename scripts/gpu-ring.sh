#!/usr/bin/env bash
# The fp8 indexer kernel's ring depths (DSA_CUDA_INDEXER_RING: 6 stages at three blocks per SM,
# 9 at two, 17 at one) on the device, in one call of at most RING_BUDGET seconds (default 240).
# Runs ON the device, from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}):
#   1. parity: every ParityAttention.IndexerLogits* test (each ring gives the 6-stage ring's bits,
#      IndexerLogitsE4m3EveryRingIsBitwiseTheDefault; the CPU's logits at each ring; interleaved
#      tiles give the contiguous ones' bits); RING_PARITY names other tests, RING_PARITY_S their
#      limit (150 s);
#   2. dsa_gpu_bench's indexer rows at B = 1 (L = 128K) and B = 64 (L = 32K), eager and in a
#      graph: fp8 at each ring, with the encoded and the given query, and bf16;
#   3. memcheck and racecheck over ParityAttention.IndexerLogitsE4m3RingsCompact;
#   4. the indexer's block size at short rows (the default halves blocks below 512 tokens while
#      they fit on the SMs one each) against the former floor (DSA_CUDA_INDEXER_BLOCK_TOKENS=512),
#      alternating, two rounds: the tiny preset's step (context 1000, graph and eager) and the
#      V3.2 layer's (context 4096, w8a8, bf16 and fp8 index-K) at B = 1 and 8 (RING_ROUNDS
#      rounds, default 2).
# Files in $OUT: summary.md, ring.log, ring-json.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup ring.log "${RING_BUDGET:-240}"
budgeted_parity "${RING_PARITY_S:-150}" "$P" \
  --gtest_filter="${RING_PARITY:-ParityAttention.IndexerLogits*}" --gtest_output="json:$OUT/parity.json"
budgeted bench 90 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
  --indexer-rows 1,64 --json "$OUT/bench.json"
for tool in memcheck racecheck; do
  budgeted "sanitizer-$tool" 60 "$SAN" --tool "$tool" --error-exitcode 17 --print-limit 30 \
    $([[ $tool == racecheck ]] && echo --racecheck-report all) "$P" \
    --gtest_filter='ParityAttention.IndexerLogitsE4m3RingsCompact' --gtest_brief=1
done

V32=(bench-decode --backend cuda --preset v32 --layers 1 --context 4096 --iters 10
     --gemm invariant --weights w8a8 --batches 1 8)
for round in $(seq "${RING_ROUNDS:-2}"); do
  for blocks in auto 512; do
    knob=(); [[ $blocks == 512 ]] && knob=(DSA_CUDA_INDEXER_BLOCK_TOKENS=512)
    budgeted "tiny-$blocks-$round" 40 env "${knob[@]}" "$DSA" bench-decode --backend cuda \
      --preset tiny --layers 0 --batches 1 8 --context 1000 --iters 200 \
      --json "$OUT/tiny-$blocks-$round.json"
    for index_k in bf16 fp8; do
      budgeted "decode-$index_k-$blocks-$round" 45 env "${knob[@]}" "$DSA" "${V32[@]}" \
        --index-k "$index_k" --json "$OUT/decode-$index_k-$blocks-$round.json"
    done
  done
done

{
  steps_summary "The fp8 indexer's ring depths on the device"
  echo "## Indexer rows (us eager, us in a graph, % of copy in the graph)"
  echo
  python3 - "$OUT/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("| row | us | graph us | graph % of copy | floor us |")
print("|---|---|---|---|---|")
for r in d["results"]:
    if r["name"].startswith("indexer_logits"):
        e = r["extra"]
        print(f"| {r['name']} | {r['us']:.2f} | {e['graph_us']:.2f} | {e['graph_pct_of_copy']:.1f}% "
              f"| {r['floor_us']:.2f} |")
PY
  echo
  echo "## Steps: the indexer's block size by the new rule (auto) or the former floor (512)"
  echo
  python3 bench/gpu/decode_table.py --eager --prefix tiny- "$OUT"
  echo
  python3 bench/gpu/decode_table.py "$OUT"
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json ring-json.tar.gz
