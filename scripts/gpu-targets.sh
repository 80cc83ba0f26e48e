#!/usr/bin/env bash
# The rows the performance targets are stated on (the attention kernels and the V3.2 decode
# step), in one device call of at most TARGETS_BUDGET seconds (default 540). Runs ON the device,
# from the repository root, with the build of scripts/gpu-build.sh carried
# (build-gpu/{lib,tests,bench,dsa}):
#   1. parity of the newest GEMM mode (ParityGemmW8a8.*), which the steps below run, or of the
#      gtest filter TARGETS_PARITY (within TARGETS_PARITY_S seconds, default 150);
#   2. the V3.2 layer's decode step (bench-decode, 1 layer, context 4096, B = 1 / 8 / 64 / 256,
#      graph replay, --gemm invariant) with --weights w8a8 (the default sparse MLA, then hn at 8
#      splits), bf16 and fp8;
#   3. --profile of that step (w8a8, B = 1) and of the tiny preset's, and the tiny preset's graph
#      against eager at B = 1 / 8 / 64 / 256;
#   4. dsa_gpu_bench's attention rows (sparse MLA, top-k, indexer logits) and the torch baselines
#      in the same call, joined by report.py;
#   5. dsa_gpu_bench's GEMM rows (the invariant GEMM, fp8 weights and w8a8 against cuBLASLt).
# The steps run in that order, each with its timeout cut to the budget left (a run cut short
# keeps the first). Files in $OUT: summary.md, targets.log, report.md, and targets-json.tar.gz
# (parity.json, decode-*.json, profile-*.json, tiny.json, bench.json, torch_attention.json,
# gemm_bench.json).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
budget_setup targets.log "${TARGETS_BUDGET:-540}"
V32=(--backend cuda --preset v32 --layers 1 --context 4096 --iters 10 --gemm invariant)

budgeted_parity "${TARGETS_PARITY_S:-150}" "$P" --gtest_filter="${TARGETS_PARITY:-ParityGemmW8a8.*}" \
  --gtest_output="json:$OUT/parity.json"

decode() {  # decode NAME WEIGHTS [ENV=VALUE...]
  local name="$1" weights="$2"
  shift 2
  budgeted "decode-v32-$name" 60 env DSA_CUDA_GEMM_FP8=wgmma "$@" "$DSA" bench-decode "${V32[@]}" \
    --batches 1 8 64 256 --weights "$weights" --json "$OUT/decode-$name.json"
}
decode w8a8 w8a8
decode w8a8-hn8 w8a8 DSA_CUDA_SPARSE_MLA_VARIANT=hn DSA_CUDA_SPARSE_MLA_MAX_SPLITS=8
decode bf16 bf16
decode fp8 fp8
budgeted profile-v32-w8a8 45 "$DSA" bench-decode "${V32[@]}" --batches 1 --weights w8a8 \
  --profile --json "$OUT/profile-v32-w8a8.json"
budgeted profile-tiny 30 "$DSA" bench-decode --backend cuda --preset tiny --layers 0 --batches 1 \
  --context 1000 --iters 200 --profile --json "$OUT/profile-tiny.json"
budgeted decode-tiny 45 "$DSA" bench-decode --backend cuda --preset tiny --layers 0 \
  --batches 1 8 64 256 --context 1000 --iters 200 --json "$OUT/tiny.json"

budgeted dsa_gpu_bench 120 "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm \
  --json "$OUT/bench.json"
budgeted torch_attention 60 python3 bench/gpu/torch_attention.py --json "$OUT/torch_attention.json"
if [[ -f $OUT/bench.json ]]; then
  budgeted report 10 python3 bench/gpu/report.py --dsa "$OUT/bench.json" \
    --torch "$OUT/torch_attention.json" --markdown "$OUT/report.md"
fi
budgeted gemm-bench 150 "$B/bench/dsa_gpu_bench" --skip-store --skip-attention \
  --json "$OUT/gemm_bench.json"

{
  steps_summary "The targets' rows on the device"
  echo "## V3.2 decode step, one layer, context 4096 (graph replay, ms)"
  echo
  python3 bench/gpu/decode_table.py "$OUT"
  for name in profile-v32-w8a8 profile-tiny decode-tiny; do
    echo
    echo "## $name"
    echo
    log_section "$name" | grep -vE "^===" | sed 's/^/    /'
  done
  echo
  echo "## attention rows against torch"
  echo
  [[ -f $OUT/report.md ]] && cat "$OUT/report.md"
  echo
  echo "## GEMM"
  echo
  log_section gemm-bench | sed -n '/^gemm: invariant time \/ cuBLASLt time, wgmma/,/^(\* kKN/p' |
    sed 's/^/    /'
  log_section gemm-bench | sed -n '/^gemm: fp8-weight invariant/,/^(! after a ratio: the fp8/p' |
    sed 's/^/    /'
} > "$OUT/summary.md"
cat "$OUT/summary.md"
pack_json targets-json.tar.gz
