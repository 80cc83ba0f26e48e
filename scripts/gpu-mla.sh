#!/usr/bin/env bash
# The sparse MLA kernels' GPU check, the commands of bench/results/2026-12-04-h200-mla-ws.md in one
# device call. Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}), in about 5 minutes:
#   1. every sparse MLA parity test (ParityAttention.SparseMla*: each kernel against the CPU, the
#      warp-specialized kernel bitwise against wgmma64, ragged topk, 4 / 8 / 16 splits, batch
#      invariance) and the graph-replay parity tests (*ParityGraph*: the default kernel in a step);
#   2. memcheck, racecheck, synccheck and initcheck over SparseMlaWgmma64Compact (wgmma64 and ws,
#      8 and 16 splits, bf16 and fp8: wgmma64's dispatch to the wgmma kernel, ws's own expansion);
#      racecheck's hazards tabled by source line
#      (racecheck.md);
#   3. dsa_gpu_bench's sparse MLA rows (every kernel, 4 / 8 / 16 splits, eager and graph), tabled
#      in table.md, and one traced launch of ws per B (--mla-trace: its CTAs' mean prologue,
#      first chunk, token loop, combine, in trace.md).
# MLA_SKIP_CHECKS=1 leaves out steps 1 and 2 (a second call after a first that ran them);
# MLA_RACE_ONLY=1 runs racecheck and its table alone (racecheck.md, racecheck-raw.txt: the first
# hazards as reported).
# MLA_DECODE=step adds the V3.2 decode step (bench-decode, 1 layer, B = 1 / 8 / 64 / 256) with the
# defaults, with the former ones (64 heads per CTA, q through the cluster), on fp8 latent caches
# with the default and with the wgmma kernel, and a 1500-step check-replay on bf16 and on fp8
# caches; MLA_DECODE=1 adds to that the step at 8, 2 and 1 splits and B = 1's rows and trace at 8
# splits. MLA_NCU=1 adds Nsight Compute on the ws kernel at B = 64 and
# B = 1 (stall samples per source line, bench/gpu/ncu_stalls.py).
# Every step has a timeout; the script goes on after a failure. Files in $OUT: summary.md,
# mla.log, parity.json, bench.json, table.md, trace.md, racecheck.md; with the options
# decode-*.json, bench-*.json, ncu-*-stalls.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup mla.log
P="$B/tests/dsa_parity_tests"
G="$B/bench/dsa_gpu_bench"
COMPACT=ParityAttention.SparseMlaWgmma64Compact

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
RACE_ONLY=${MLA_RACE_ONLY:-0}
DECODE=${MLA_DECODE:-0}
if [[ ${MLA_SKIP_CHECKS:-0} != 1 ]]; then
  if [[ $RACE_ONLY != 1 ]]; then
    step parity 420 "$P" --gtest_filter='ParityAttention.SparseMla*:*ParityGraph*' \
      --gtest_output="json:$OUT/parity.json"
    for tool in memcheck synccheck initcheck; do
      sanitize "sanitizer-$tool" "$tool" 60 "$P" --gtest_filter="$COMPACT" --gtest_brief=1
    done
  fi
  step sanitizer-racecheck 180 "$SAN" --tool racecheck --racecheck-report all \
    --print-limit 100000 "$P" --gtest_filter="$COMPACT" --gtest_brief=1
  # racecheck's hazards by source-location pair (a report it cannot table fails the step).
  step racecheck-table 10 python3 bench/gpu/racecheck_table.py "$LOG" "$OUT/racecheck.md" \
    --raw "$OUT/racecheck-raw.txt"
fi
# MLA_RACE_ONLY=1: racecheck and its table alone (the bench and the options are left out).
[[ $RACE_ONLY == 1 ]] && DECODE=0 MLA_NCU=0
[[ $RACE_ONLY == 1 ]] || step dsa_gpu_bench 150 "$G" --skip-store --skip-gemm --attention-only \
  sparse_mla --mla-trace \
  --json "$OUT/bench.json"
[[ $RACE_ONLY == 1 ]] || step table 10 python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
lines = ["| row | us | TFLOP/s | % of bf16 |", "|---|---|---|---|"]
for r in json.load(open(os.path.join(out, "bench.json"))).get("results", []):
    if not r["name"].startswith("sparse_mla/"):
        continue
    e = r.get("extra", {})
    lines.append(f"| {r['name']} | {r['us']:.2f} | {e.get('tflops', 0):.1f} | "
                 f"{e.get('pct_of_bf16', 0):.1f}% |")
open(os.path.join(out, "table.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
keys = ["ctas", "sms", "covered", "q_stored_us", "prologue_us", "first_chunk_us", "loop_us",
        "chunk_us", "wg1_after_wg0_us", "parts_us", "pull_us", "exit_us", "combine_us", "life_us"]
trace = ["| row | span us | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
for r in json.load(open(os.path.join(out, "bench.json"))).get("results", []):
    if r["name"].startswith("sparse_mla_trace/"):
        e = r.get("extra", {})
        trace.append(f"| {r['name']} | {r['us']:.2f} | " +
                     " | ".join(f"{e.get(k, 0):.2f}" for k in keys) + " |")
trace += ["", "| exchange | us a CTA | cycles | remote B/clk | launch span us | SMs |",
          "|---|---|---|---|---|---|"]
for r in json.load(open(os.path.join(out, "bench.json"))).get("results", []):
    if r["name"].startswith("cluster_exchange/"):
        e = r.get("extra", {})
        trace.append(f"| {r['name']} | {r['us']:.2f} | {e.get('cta_cycles', 0):.0f} | "
                     f"{e.get('remote_bytes_per_clk', 0):.1f} | {e.get('launch_us', 0):.2f} | "
                     f"{e.get('sms', 0)} |")
open(os.path.join(out, "trace.md"), "w").write("\n".join(trace) + "\n")
print("\n".join(trace))
EOF

decode() {  # decode NAME [ENV=VALUE...] [-- bench-decode flags]: the V3.2 step at B = 1 / 8 / 64 / 256
  local name="$1" env_args=() flags=()
  shift
  while [[ $# -gt 0 && $1 != -- ]]; do env_args+=("$1"); shift; done
  [[ $# -gt 0 ]] && { shift; flags=("$@"); }
  step "decode-v32-$name" 150 env "${env_args[@]}" "$B/dsa" bench-decode --backend cuda \
    --preset v32 --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant \
    "${flags[@]}" --json "$OUT/decode-$name.json"
}
if [[ $DECODE == 1 ]]; then
  for splits in 8 2 1; do decode "splits$splits" DSA_CUDA_SPARSE_MLA_MAX_SPLITS=$splits; done
  # B = 1 at 8 splits (the latency configuration): the rows and the trace.
  step bench-latency 90 env DSA_CUDA_SPARSE_MLA_MAX_SPLITS=8 "$G" --skip-store --skip-gemm \
    --attention-only sparse_mla --sparse-mla-rows 1 --mla-trace --json "$OUT/bench-latency.json"
fi
if [[ $DECODE == 1 || $DECODE == step ]]; then
  # The defaults against the former ones: bf16 with 64 heads per CTA and q through the cluster
  # (the same bits), fp8 with the wgmma kernel (its own bits); then check-replay on both caches.
  decode default
  decode former DSA_CUDA_SPARSE_MLA_HEADS=64 DSA_CUDA_SPARSE_MLA_Q=cluster
  decode fp8 -- --latent fp8
  decode fp8-wgmma DSA_CUDA_SPARSE_MLA_VARIANT=wgmma -- --latent fp8
  step check-replay 120 "$B/dsa" --log error check-replay --backend cuda --steps 1500 --seed 7
  step check-replay-fp8 120 "$B/dsa" --log error check-replay --backend cuda --latent fp8 \
    --index-k fp8 --steps 1500 --seed 7
fi

if [[ ${MLA_NCU:-0} == 1 ]]; then
  NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
  for rows in 64 1; do
    name="ncu-ws-b$rows"
    step "$name" 150 "$NCU" --kernel-name regex:sparse_mla_ws_kernel --launch-skip 3 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters \
      --section LaunchStats --section Occupancy --import-source yes -f -o "$OUT/$name" \
      "$G" --skip-store --skip-gemm --attention-only sparse_mla --sparse-mla-rows "$rows"
    step "$name-stalls" 90 bash -c "'$NCU' -i '$OUT/$name.ncu-rep' --page source --csv \
      --print-source cuda,sass > '$OUT/$name.csv' && python3 bench/gpu/ncu_stalls.py \
      '$OUT/$name.csv' 40 > '$OUT/$name-stalls.txt'"
    rm -f "$OUT/$name.ncu-rep" "$OUT/$name.csv"
  done
fi

# The configurations side by side (options.md): the decode step per B from every decode-*.json,
# and from bench.json and every bench-*.json the default kernel's rows per dtype and B with ws's
# trace (q stored, token loop, combine, life per CTA).
step options-table 10 python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
sys.path.insert(0, "bench/gpu")
from decode_table import table
lines = table(out)
lines += ["", "| bench (default kernel) | row | us | TFLOP/s | q stored | loop | combine | life |",
          "|---|---|---|---|---|---|---|---|"]
for path in [os.path.join(out, "bench.json")] + sorted(glob.glob(os.path.join(out, "bench-*.json"))):
    if not os.path.exists(path):
        continue
    results = json.load(open(path)).get("results", [])
    trace = {r["name"].split("/")[2]: r.get("extra", {}) for r in results
             if r["name"].startswith("sparse_mla_trace/")}
    name = os.path.basename(path)[:-len(".json")]
    for r in results:
        parts = r["name"].split("/")
        if len(parts) != 5 or parts[0] != "sparse_mla" or parts[-1] != "topk=2048":
            continue
        t = trace.get(parts[2], {}) if parts[1] == "bf16" else {}
        cells = [f"{t[k]:.2f}" if k in t else "" for k in
                 ("q_stored_us", "loop_us", "combine_us", "life_us")]
        lines.append(f"| {name} | {parts[1]} {parts[2]} | {r['us']:.2f} | "
                     f"{r.get('extra', {}).get('tflops', 0):.0f} | " + " | ".join(cells) + " |")
open(os.path.join(out, "options.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

{
  steps_summary "GPU sparse MLA check"
  for f in table.md options.md trace.md racecheck.md; do
    [[ -f $OUT/$f ]] && { echo; echo "## $f"; echo; cat "$OUT/$f"; }
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
# A racecheck report can make the log too large to come back whole: compressed past 4 MB.
if [[ $(stat -c %s "$LOG") -gt 4000000 ]]; then gzip -f "$LOG"; fi
