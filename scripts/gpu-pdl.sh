#!/usr/bin/env bash
# Programmatic dependent launch (DSA_CUDA_PDL=on, src/backend/cuda/pdl.h) on the device, in one
# call of about 6 minutes. Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}):
#   1. with PDL on: the parity tests of every op a decode step launches and the graph-replay ones
#      (a kernel that read its predecessor's output before it was complete would differ from the
#      CPU, or from eager mode); memcheck over the graph-replay parity tests (both index-K dtypes);
#   2. check-replay with PDL on: graph against eager over 1500 steps with the auditor (CLEAN), and
#      the incident's faults (CORRUPTION FOUND, every clobber named);
#   3. the decode step with PDL off and on, one process each: V3.2 dims (1 layer, B = 1 / 8 / 64 /
#      256, context 4096; bf16 and w8a8 weights, whose GEMMs copy their first weights before the
#      wait) and the tiny preset (graph against eager), tabled in pdl.md.
# Every step has a timeout; the script goes on after a failure. Files in $OUT: summary.md, pdl.log,
# pdl.md, pdl-json.tar.gz (parity.json, decode-*.json).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup pdl.log
P="$B/tests/dsa_parity_tests"
DECODE_OPS='*ParityGraph*:ParityOps.*:ParityFused.*:ParityStore*:ParitySample*:ParityMoe*'
DECODE_OPS+=':ParityAttention.SparseMlaWgmma64Compact:ParityAttention.SparseMlaWgmmaCompact'
DECODE_OPS+=':ParityAttention.TopkBatchInvariant:ParityAttention.IndexerLogitsMatchCpu'
DECODE_OPS+=':ParityGemm.GivenBf16CopyGivesTheSameBits:ParityAudit*'
# The GEMMs that copy constant weights before their wait (GemmParams::w_constant): a chain over a
# poisoned intermediate, and the w8a8 kernel's tests.
DECODE_OPS+=':ParityGemm.ConstantWeightsUnderPdlSeeTheirProducersOutput:ParityGemmW8a8.*'

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
step parity-pdl 360 env DSA_CUDA_PDL=on "$P" --gtest_filter="$DECODE_OPS" \
  --gtest_output="json:$OUT/parity.json"
sanitize sanitizer-memcheck-pdl memcheck 240 env DSA_CUDA_PDL=on "$P" \
  --gtest_filter='*/ParityGraph.*' --gtest_brief=1
step check-replay-pdl 120 env DSA_CUDA_PDL=on "$B/dsa" --log error check-replay --backend cuda \
  --steps 1500 --seed 7
# The incident's replay: expect_incident (gpu-steps.sh).
step check-replay-pdl-incident 120 bash -c 'expect_incident "$@"' _ env DSA_CUDA_PDL=on \
  "$B/dsa" --log error check-replay --backend cuda --steps 1500 --seed 7 --inject incident
for pdl in off on; do
  step "decode-v32-pdl-$pdl" 150 env DSA_CUDA_PDL=$pdl "$B/dsa" bench-decode --backend cuda \
    --preset v32 --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant \
    --json "$OUT/decode-v32-pdl-$pdl.json"
  step "decode-v32w8a8-pdl-$pdl" 150 env DSA_CUDA_PDL=$pdl "$B/dsa" bench-decode --backend cuda \
    --preset v32 --layers 1 --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant \
    --weights w8a8 --json "$OUT/decode-v32w8a8-pdl-$pdl.json"
  step "decode-tiny-pdl-$pdl" 90 env DSA_CUDA_PDL=$pdl "$B/dsa" bench-decode --backend cuda \
    --preset tiny --layers 0 --batches 1 8 64 256 --context 1000 --iters 50 \
    --json "$OUT/decode-tiny-pdl-$pdl.json"
done

step pdl-table 10 python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
lines = ["| preset | B | graph ms, off | graph ms, on | on / off | eager ms, on | eager / graph, on |",
         "|---|---|---|---|---|---|---|"]
for preset in ("v32", "v32w8a8", "tiny"):
    runs = {}
    for pdl in ("off", "on"):
        path = os.path.join(out, f"decode-{preset}-pdl-{pdl}.json")
        if os.path.exists(path):
            runs[pdl] = {r["batch"]: r for r in json.load(open(path)).get("results", [])}
    for b in sorted(set(runs.get("off", {})) | set(runs.get("on", {}))):
        off, on = runs.get("off", {}).get(b), runs.get("on", {}).get(b)
        g_off = off["graph_ms"] if off else float("nan")
        g_on = on["graph_ms"] if on else float("nan")
        e_on = on["eager_ms"] if on else float("nan")
        lines.append(f"| {preset} | {b} | {g_off:.3f} | {g_on:.3f} | {g_on / g_off:.3f} | "
                     f"{e_on:.3f} | {e_on / g_on:.2f} |")
open(os.path.join(out, "pdl.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

{
  steps_summary "GPU programmatic dependent launch check"
  [[ -f $OUT/pdl.md ]] && { echo "## pdl.md"; echo; cat "$OUT/pdl.md"; }
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json pdl-json.tar.gz  # a device call brings back at most 8 files
