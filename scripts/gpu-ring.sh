#!/usr/bin/env bash
# The fp8 indexer kernel's ring depths (DSA_CUDA_INDEXER_RING: 6 stages at three blocks per SM,
# 9 at two, 17 at one) on the device, in one call of at most RING_BUDGET seconds (default 240).
# Runs ON the device, from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}):
#   1. parity: every ParityAttention.IndexerLogits* test (each ring gives the 6-stage ring's bits,
#      IndexerLogitsE4m3EveryRingIsBitwiseTheDefault; the CPU's logits at each ring);
#   2. dsa_gpu_bench's indexer rows at B = 1 (L = 128K) and B = 64 (L = 32K), eager and in a
#      graph: fp8 at each ring, with the encoded and the given query, and bf16;
#   3. memcheck and racecheck over ParityAttention.IndexerLogitsE4m3RingsCompact.
# Files in $OUT: summary.md, ring.log, ring-json.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup ring.log "${RING_BUDGET:-240}"
budgeted_parity "${RING_PARITY_S:-150}" "$P" --gtest_filter='ParityAttention.IndexerLogits*' \
  --gtest_output="json:$OUT/parity.json"
budgeted bench 90 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
  --indexer-rows 1,64 --json "$OUT/bench.json"
for tool in memcheck racecheck; do
  budgeted "sanitizer-$tool" 60 "$SAN" --tool "$tool" --error-exitcode 17 --print-limit 30 \
    $([[ $tool == racecheck ]] && echo --racecheck-report all) "$P" \
    --gtest_filter='ParityAttention.IndexerLogitsE4m3RingsCompact' --gtest_brief=1
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
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json ring-json.tar.gz
