#!/usr/bin/env bash
# The indexer-logits kernel's GPU check, both variants ("resident", the default, and "legacy",
# the former kernel). Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}), in about 3 minutes (the step
# timeouts add up to 590 s, under the 10-minute limit of one device command):
#   the indexer parity tests (every variant x block size against the CPU, the variants bitwise
#   equal, bad page ids, batch invariance);
#   compute-sanitizer memcheck, racecheck, synccheck and initcheck over the indexer parity cases,
#   and memcheck over a graph-replayed decode with the fp8 index-K cache;
#   dsa_gpu_bench's indexer rows beside the former kernel's (rows indexer_logits_legacy/...),
#   eager and in a CUDA graph, then the same rows at forced block sizes and at forced
#   cluster sizes 1 and 4 of the resident variant (sweep.md);
#   the torch baselines of the same rows, joined by report.py.
# Every step has a timeout and the script goes on after a failure. Files in $OUT: summary.md,
# indexer.log, parity.json, bench.json, bench-{tokens,cluster}-*.json, sweep.md,
# torch_attention.json, report.md.
set -uo pipefail
cd "$(dirname "$0")/.."

# The sanitizers' cases: the default dispatch (clusters of 4 and of 1 among them), bad page ids;
# memcheck also every cluster size and the variants' bitwise comparison.
FILTER=ParityAttention.IndexerLogitsMatchCpu:ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike
MEMCHECK_FILTER=$FILTER:ParityAttention.IndexerLogitsEveryClusterSizeMatchesCpu
MEMCHECK_FILTER+=:ParityAttention.IndexerLogitsVariantsAgreeBitwise

source scripts/gpu-steps.sh
steps_setup indexer.log

step nvidia-smi 10 nvidia-smi
step parity 90 "$B/tests/dsa_parity_tests" --gtest_filter='ParityAttention.IndexerLogits*' \
  --gtest_output="json:$OUT/parity.json"
sanitize sanitizer-memcheck memcheck 100 "$B/tests/dsa_parity_tests" \
  --gtest_filter="$MEMCHECK_FILTER" --gtest_brief=1
sanitize sanitizer-racecheck racecheck 80 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-synccheck synccheck 25 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-initcheck initcheck 25 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-memcheck-replay memcheck 40 \
  "$B/dsa" --log error check-replay --backend cuda --latent fp8 --index-k fp8 --steps 20 \
  --buckets 1 4 --no-parity
step dsa_gpu_bench 45 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm \
  --attention-only indexer_logits --legacy --json "$OUT/bench.json"
for tokens in 512 2048 8192; do
  step "bench-tokens-$tokens" 25 env DSA_CUDA_INDEXER_BLOCK_TOKENS="$tokens" \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits --legacy \
    --json "$OUT/bench-tokens-$tokens.json"
done
for ranks in 1 4; do
  step "bench-cluster-$ranks" 25 env DSA_CUDA_INDEXER_CLUSTER="$ranks" \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits \
    --json "$OUT/bench-cluster-$ranks.json"
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
[[ -f $OUT/sweep.md ]] && { echo; echo "## block-size sweep"; echo; cat "$OUT/sweep.md"; } \
  | tee -a "$OUT/summary.md"
