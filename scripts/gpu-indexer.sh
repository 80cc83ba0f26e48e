#!/usr/bin/env bash
# The indexer-logits kernel's GPU check, every variant ("legacy"; "resident"; "wgmma", warpgroup
# MMA, and its "wgmma-n64" and "wgmma-pipe" fp8 schedules; "wgmma-e4m3", fp8 on the e4m3 tensor
# core). Runs ON the device, from the
# repository root, with the build of scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,
# dsa}), in under 5 minutes (the step timeouts add up to 280 s):
#   the indexer parity tests (every variant x block size against the CPU, the mma.sync variants
#   bitwise equal, the wgmma schedules bitwise equal, each variant bitwise equal across block
#   sizes, bad page ids, batch invariance);
#   compute-sanitizer memcheck and racecheck over one small case family (bad page ids, padded
#   rows, bf16 and both fp8 roundings) with one variant forced (INDEXER_SAN_VARIANT, default
#   wgmma-e4m3), and memcheck over the fp8 kernel reading a given query's encoding;
#   dsa_gpu_bench's indexer rows, fp8 and bf16 at B = 1 L = 128K, B = 64 L = 32K and B = 256
#   L = 32K: the default (fp8 also .../given, the query's encoding given), then legacy, wgmma,
#   wgmma-n64, wgmma-pipe and wgmma-e4m3 forced (rows indexer_logits_<variant>/...), eager and in
#   a CUDA graph, tabled in table.md.
# INDEXER_SWEEP=1 then adds (past the 5 minutes) synccheck and initcheck over the default
# dispatch, memcheck over a graph-replayed decode, the forced block-size and cluster-size sweeps
# (sweep.md) and the torch baselines joined by report.py (report.md).
# Every step has a timeout and the script goes on after a failure. Files in $OUT: summary.md,
# indexer.log, parity.json, bench.json, table.md; with the sweep also bench-{tokens,cluster}-*.json,
# sweep.md, torch_attention.json, report.md.
set -uo pipefail
cd "$(dirname "$0")/.."

SAN_VARIANT="${INDEXER_SAN_VARIANT:-wgmma-e4m3}"
SAN_FILTER=ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike

source scripts/gpu-steps.sh
steps_setup indexer.log

step nvidia-smi 5 nvidia-smi
step parity 150 "$B/tests/dsa_parity_tests" \
  --gtest_filter='ParityAttention.IndexerLogits*:*ParityGraph.GivenIndexQuery*' \
  --gtest_output="json:$OUT/parity.json"
sanitize sanitizer-memcheck memcheck 35 env DSA_CUDA_INDEXER_VARIANT="$SAN_VARIANT" \
  "$B/tests/dsa_parity_tests" --gtest_filter="$SAN_FILTER" --gtest_brief=1
sanitize sanitizer-racecheck racecheck 45 env DSA_CUDA_INDEXER_VARIANT="$SAN_VARIANT" \
  "$B/tests/dsa_parity_tests" --gtest_filter="$SAN_FILTER" --gtest_brief=1
# The default fp8 kernel reading the query's encoding it is given (DSA_CUDA_INDEXER_Q=given).
sanitize sanitizer-memcheck-given memcheck 60 "$B/tests/dsa_parity_tests" \
  --gtest_filter=ParityAttention.IndexerLogitsGivenQueryIsBitwiseTheEncodedOne --gtest_brief=1
step dsa_gpu_bench 90 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm \
  --attention-only indexer_logits --indexer-variants legacy,wgmma,wgmma-n64,wgmma-pipe,wgmma-e4m3 \
  --indexer-rows 1,64,256 --json "$OUT/bench.json"
step table 5 python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = {}
for r in json.load(open(os.path.join(out, "bench.json"))).get("results", []):
    if not r["name"].startswith("indexer_logits") or "/" not in r["name"]:
        continue
    variant, shape = r["name"].split("/", 1)
    variant = variant[len("indexer_logits_"):] or "default"
    e = r.get("extra", {})
    rows.setdefault(shape, {})[variant] = (r["us"], e.get("pct_of_copy", 0), e.get("graph_us", 0))
variants = ["default", "legacy", "wgmma", "wgmma-n64", "wgmma-pipe", "wgmma-e4m3"]
lines = ["| row | " + " | ".join(f"{v} us (% copy) | {v} graph us" for v in variants) + " |",
         "|---|" + "---|---|" * len(variants)]
for shape, by in rows.items():
    cells = [f"{by[v][0]:.2f} ({by[v][1]:.0f}%) | {by[v][2]:.2f}" if v in by else "- | -"
             for v in variants]
    lines.append(f"| {shape} | " + " | ".join(cells) + " |")
open(os.path.join(out, "table.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

if [[ ${INDEXER_SWEEP:-0} != 1 ]]; then
  {
    steps_summary "GPU indexer-logits check"
    [[ -f $OUT/table.md ]] && cat "$OUT/table.md"
  } > "$OUT/summary.md"
  cat "$OUT/summary.md"
  exit 0
fi

FILTER=ParityAttention.IndexerLogitsMatchCpu:ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike
sanitize sanitizer-synccheck synccheck 25 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-initcheck initcheck 25 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-memcheck-replay memcheck 40 \
  "$B/dsa" --log error check-replay --backend cuda --latent fp8 --index-k fp8 --steps 20 \
  --buckets 1 4 --no-parity
for tokens in 256 512 2048 8192; do
  step "bench-tokens-$tokens" 25 env DSA_CUDA_INDEXER_BLOCK_TOKENS="$tokens" \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
    --indexer-variants legacy,wgmma,wgmma-n64,wgmma-pipe,wgmma-e4m3 \
    --json "$OUT/bench-tokens-$tokens.json"
done
for ranks in 1 4; do
  step "bench-cluster-$ranks" 25 env DSA_CUDA_INDEXER_CLUSTER="$ranks" \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
    --indexer-variants resident --json "$OUT/bench-cluster-$ranks.json"
done
step sweep-table 10 python3 - "$OUT" <<'EOF'
import glob, json, os, re, sys
out = sys.argv[1]
lines = ["| forced | row | us | % copy | graph us | graph % copy |", "|---|---|---|---|---|---|"]
files = sorted(glob.glob(os.path.join(out, "bench-tokens-*.json")),
               key=lambda f: int(re.findall(r"(\d+)\.json$", f)[0]))
files += sorted(glob.glob(os.path.join(out, "bench-cluster-*.json")))
for f in [os.path.join(out, "bench.json")] + files:
    base = os.path.basename(f)
    tokens = "-" if base == "bench.json" else base[len("bench-"):-len(".json")]
    for r in json.load(open(f)).get("results", []):
        if not r["name"].startswith("indexer_logits"):
            continue
        e = r.get("extra", {})
        lines.append(f"| {tokens} | {r['name']} | {r['us']:.2f} | {e.get('pct_of_copy', 0):.0f}% | "
                     f"{e.get('graph_us', 0):.2f} | {e.get('graph_pct_of_copy', 0):.0f}% |")
open(os.path.join(out, "sweep.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
step torch_attention 30 python3 bench/gpu/torch_attention.py --only indexer_logits \
  --json "$OUT/torch_attention.json"
attention_summary "GPU indexer-logits check"
for f in table.md sweep.md; do
  [[ -f $OUT/$f ]] && { echo; echo "## $f"; echo; cat "$OUT/$f"; } | tee -a "$OUT/summary.md"
done
