#!/usr/bin/env bash
# The indexer-logits kernel's GPU check, both variants ("resident", the default, and "legacy",
# the former kernel). Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}), in under 6 minutes (the step
# timeouts add up to 580 s; a normal run takes about 2):
#   the indexer parity tests (every variant x block size against the CPU, the variants bitwise
#   equal, bad page ids, batch invariance);
#   compute-sanitizer memcheck, racecheck, synccheck and initcheck over the indexer parity cases,
#   and memcheck over a graph-replayed decode with the fp8 index-K cache;
#   dsa_gpu_bench's indexer rows beside the former kernel's (rows indexer_logits_legacy/...),
#   eager and in a CUDA graph, then the same rows at every forced block size (sweep.md);
#   the torch baselines of the same rows, joined by report.py.
# Every step has a timeout and the script goes on after a failure. Files in $OUT: summary.md,
# indexer.log, parity.json, bench.json, bench-tokens-*.json, sweep.md, torch_attention.json,
# report.md.
set -uo pipefail
cd "$(dirname "$0")/.."

FILTER='ParityAttention.IndexerLogitsMatchCpu:ParityAttention.IndexerLogitsBadPageIdsRaiseTheFlagAlike'

source scripts/gpu-steps.sh
steps_setup indexer.log

step nvidia-smi 10 nvidia-smi
step parity 120 "$B/tests/dsa_parity_tests" --gtest_filter='ParityAttention.IndexerLogits*' \
  --gtest_output="json:$OUT/parity.json"
sanitize sanitizer-memcheck memcheck 60 "$B/tests/dsa_parity_tests" \
  --gtest_filter="$FILTER:ParityAttention.IndexerLogitsVariantsAgreeBitwise" --gtest_brief=1
sanitize sanitizer-racecheck racecheck 90 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-synccheck synccheck 40 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-initcheck initcheck 40 "$B/tests/dsa_parity_tests" --gtest_filter="$FILTER" \
  --gtest_brief=1
sanitize sanitizer-memcheck-replay memcheck 40 \
  "$B/dsa" --log error check-replay --backend cuda --latent fp8 --index-k fp8 --steps 20 \
  --buckets 1 4 --no-parity
step dsa_gpu_bench 60 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm \
  --attention-only indexer_logits --legacy --json "$OUT/bench.json"
for tokens in 512 1024 2048 4096 8192; do
  step "bench-tokens-$tokens" 40 env DSA_CUDA_INDEXER_BLOCK_TOKENS="$tokens" \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only indexer_logits --legacy \
    --json "$OUT/bench-tokens-$tokens.json"
done
step sweep-table 10 python3 - "$OUT" <<'EOF'
import glob, json, os, re, sys
out = sys.argv[1]
lines = ["| block tokens | row | us | % copy | graph us | graph % copy |", "|---|---|---|---|---|---|"]
files = sorted(glob.glob(os.path.join(out, "bench-tokens-*.json")),
               key=lambda f: int(re.findall(r"(\d+)\.json$", f)[0]))
for f in [os.path.join(out, "bench.json")] + files:
    tokens = "auto" if f.endswith("bench.json") else re.findall(r"(\d+)\.json$", f)[0]
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
