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
#   4. the decode steps under each knob set of RING_SETS (default "default former 512"): default,
#      the defaults; former, the defaults before 2026-12-07's second stop (contiguous tiles, the
#      6-stage ring: DSA_CUDA_INDEXER_TILES=contiguous DSA_CUDA_INDEXER_RING=6); 512, the former
#      block floor (DSA_CUDA_INDEXER_BLOCK_TOKENS=512); alternating, RING_ROUNDS rounds (default
#      2): the tiny preset's step (context 1000, graph and eager) and the V3.2 layer's (context
#      4096, w8a8, bf16 and fp8 index-K) at B = 1, 8 and 64;
#   5. with RING_NCU=1, Nsight Compute on the fp8 kernel's B = 1, L = 128K launch: its speed of
#      light, warp states and the source lines its warps wait on (bench/gpu/ncu_stalls.py).
# RING_ROWS: the indexer rows' batches (default 1,64).
# Files in $OUT: summary.md, ring.log, ring-json.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup ring.log "${RING_BUDGET:-240}"
budgeted_parity "${RING_PARITY_S:-150}" "$P" \
  --gtest_filter="${RING_PARITY:-ParityAttention.IndexerLogits*}" --gtest_output="json:$OUT/parity.json"
budgeted bench 90 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
  --indexer-rows "${RING_ROWS:-1,64}" --json "$OUT/bench.json"
for tool in memcheck racecheck; do
  budgeted "sanitizer-$tool" 60 "$SAN" --tool "$tool" --error-exitcode 17 --print-limit 30 \
    $([[ $tool == racecheck ]] && echo --racecheck-report all) "$P" \
    --gtest_filter='ParityAttention.IndexerLogitsE4m3RingsCompact' --gtest_brief=1
done

V32=(bench-decode --backend cuda --preset v32 --layers 1 --context 4096 --iters 10
     --gemm invariant --weights w8a8 --batches 1 8 64)
knobs_of() {
  case "$1" in
    former) echo DSA_CUDA_INDEXER_TILES=contiguous DSA_CUDA_INDEXER_RING=6 ;;
    512) echo DSA_CUDA_INDEXER_BLOCK_TOKENS=512 ;;
    *) echo DSA_CUDA_INDEXER_UNSET= ;;
  esac
}
for round in $(seq "${RING_ROUNDS:-2}"); do
  for set in ${RING_SETS:-default former 512}; do
    read -ra knob <<< "$(knobs_of "$set")"
    budgeted "tiny-$set-$round" 40 env "${knob[@]}" "$DSA" bench-decode --backend cuda \
      --preset tiny --layers 0 --batches 1 8 --context 1000 --iters 200 \
      --json "$OUT/tiny-$set-$round.json"
    for index_k in bf16 fp8; do
      budgeted "decode-$index_k-$set-$round" 50 env "${knob[@]}" "$DSA" "${V32[@]}" \
        --index-k "$index_k" --json "$OUT/decode-$index_k-$set-$round.json"
    done
  done
done

if [[ ${RING_NCU:-0} == 1 ]]; then
  NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
  budgeted ncu-e4m3-b1 90 "$NCU" --clock-control none --kernel-name-base mangled \
    --kernel-name 'regex:indexer_logits_wgmma_e4m3' --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis_Tables --section Occupancy --section LaunchStats \
    --section SourceCounters --import-source yes -f -o "$OUT/e4m3-b1" \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
    --indexer-rows 1
  budgeted ncu-e4m3-b1-print 30 bash -c "'$NCU' -i '$OUT/e4m3-b1.ncu-rep' --print-summary none \
    > '$OUT/e4m3-b1-sections.txt' && '$NCU' -i '$OUT/e4m3-b1.ncu-rep' --page source --csv \
    --print-source cuda,sass > '$OUT/e4m3-b1-source.csv' && \
    python3 bench/gpu/ncu_stalls.py '$OUT/e4m3-b1-source.csv' 25 > '$OUT/e4m3-b1-stalls.txt'"
  rm -f "$OUT/e4m3-b1-source.csv"
fi

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
  echo "## Steps under each knob set (default, former: contiguous tiles and 6 stages, 512: the former block floor)"
  echo
  python3 bench/gpu/decode_table.py --eager --prefix tiny- "$OUT"
  echo
  python3 bench/gpu/decode_table.py "$OUT"
} > "$OUT/summary.md"
[[ -f $OUT/e4m3-b1-stalls.txt ]] && { echo; echo "## ncu: e4m3, B = 1, L = 128K"; echo
  echo '```'; grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers|Waves|No Eligible|Issued Warp" "$OUT/e4m3-b1-sections.txt" | head -20
  head -30 "$OUT/e4m3-b1-stalls.txt"; echo '```'; } >> "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json ring-json.tar.gz
