#!/usr/bin/env bash
# The heads-as-N sparse MLA kernel's GPU check (src/backend/cuda/sparse_mla_hn.cu,
# DSA_CUDA_SPARSE_MLA_VARIANT=hn), in one device call of about 3 minutes. Runs ON the device, from
# the repository root, with the build of scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,
# dsa}):
#   1. its parity tests (ParityAttention.SparseMlaHn*: the CPU's outputs at every split bound, bf16
#      and fp8, ragged topks, odd strides; batch invariance; fp8 bitwise against the dequantized
#      bf16 cache);
#   2. memcheck, synccheck, initcheck and racecheck over SparseMlaHnCompact (racecheck tabled by
#      source line, bench/gpu/racecheck_table.py);
#   3. dsa_gpu_bench's sparse MLA rows at B = 1, 64 and 256 (every kernel and split bound in one
#      process, the default ws beside hn) with --mla-trace (ws, hn, hn at 8 splits), tabled;
#   4. the V3.2 decode step (bench-decode, 1 layer, B = 1 / 8 / 64 / 256) with the defaults, with
#      ws at 8 splits, hn at the default bound and hn at 8 splits, and check-replay over hn.
# HN_QUICK=1 (about 2 minutes, for a short lease): memcheck and racecheck only, the bench at B = 1
# and 64, the step with the defaults and with hn at 8 splits, no check-replay.
# Every step has a timeout; the script goes on after a failure. Files in $OUT: summary.md, hn.log,
# parity.json, bench.json, table.md, trace.md, racecheck.md, decode-*.json.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup hn.log
P="$B/tests/dsa_parity_tests"
G="$B/bench/dsa_gpu_bench"
COMPACT=ParityAttention.SparseMlaHnCompact

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
step parity 300 "$P" --gtest_filter='ParityAttention.SparseMlaHn*' \
  --gtest_output="json:$OUT/parity.json"
QUICK=${HN_QUICK:-0}
TOOLS=(memcheck synccheck initcheck)
[[ $QUICK == 1 ]] && TOOLS=(memcheck)
ROWS=(--sparse-mla-rows 1,64,256)
[[ $QUICK == 1 ]] && ROWS=(--sparse-mla-rows 1,64)
for tool in "${TOOLS[@]}"; do
  sanitize "sanitizer-$tool" "$tool" 90 "$P" --gtest_filter="$COMPACT" --gtest_brief=1
done
step sanitizer-racecheck 150 "$SAN" --tool racecheck --racecheck-report all --print-limit 100000 \
  "$P" --gtest_filter="$COMPACT" --gtest_brief=1
step racecheck-table 10 python3 bench/gpu/racecheck_table.py "$LOG" "$OUT/racecheck.md" \
  --raw "$OUT/racecheck-raw.txt"

step dsa_gpu_bench 200 "$G" --skip-store --skip-gemm --attention-only sparse_mla "${ROWS[@]}" \
  --mla-trace --json "$OUT/bench.json"
step table 10 python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "bench.json"))).get("results", [])
lines = ["| row | us | TFLOP/s |", "|---|---|---|"]
for r in results:
    if r["name"].startswith("sparse_mla/"):
        lines.append(f"| {r['name']} | {r['us']:.2f} | {r.get('extra', {}).get('tflops', 0):.1f} |")
open(os.path.join(out, "table.md"), "w").write("\n".join(lines) + "\n")
keys = ["ctas", "sms", "q_stored_us", "first_chunk_us", "loop_us", "chunk_us", "wg1_after_wg0_us",
        "parts_us", "pull_us", "exit_us", "combine_us", "life_us"]
trace = ["| row | span us | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
for r in results:
    if r["name"].startswith("sparse_mla_trace/"):
        e = r.get("extra", {})
        trace.append(f"| {r['name']} | {r['us']:.2f} | " +
                     " | ".join(f"{e.get(k, 0):.2f}" for k in keys) + " |")
open(os.path.join(out, "trace.md"), "w").write("\n".join(trace) + "\n")
print("\n".join(lines + [""] + trace))
EOF

decode() {  # decode NAME [ENV=VALUE...]: the V3.2 step at B = 1 / 8 / 64 / 256, graph replay
  local name="$1"
  shift
  step "decode-v32-$name" 150 env "$@" "$B/dsa" bench-decode --backend cuda --preset v32 \
    --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant \
    --json "$OUT/decode-$name.json"
}
decode default
decode hn-splits8 DSA_CUDA_SPARSE_MLA_VARIANT=hn DSA_CUDA_SPARSE_MLA_MAX_SPLITS=8
if [[ $QUICK != 1 ]]; then
  decode hn DSA_CUDA_SPARSE_MLA_VARIANT=hn
  decode ws-splits8 DSA_CUDA_SPARSE_MLA_MAX_SPLITS=8
  step check-replay-hn 120 env DSA_CUDA_SPARSE_MLA_VARIANT=hn "$B/dsa" --log error check-replay \
    --backend cuda --steps 1500 --seed 7
fi
step decode-table 10 bash -c "python3 bench/gpu/decode_table.py '$OUT' | tee '$OUT/decode.md'"

{
  steps_summary "GPU heads-as-N sparse MLA check"
  for f in table.md trace.md decode.md racecheck.md; do
    [[ -f $OUT/$f ]] && { echo; echo "## $f"; echo; cat "$OUT/$f"; }
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
if [[ $(stat -c %s "$LOG") -gt 4000000 ]]; then gzip -f "$LOG"; fi
