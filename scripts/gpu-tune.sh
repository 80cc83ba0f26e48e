#!/usr/bin/env bash
# The tuning run of the attention kernels, in one device command of under 8 minutes: where the
# default sparse MLA kernel (wgmma64, bf16) and the fp8 indexer spend their time, and which
# indexer block size wins per batch. Runs ON the device, from the repository root, with the build
# of scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench}). Every step has a timeout; the
# script goes on after a failure. Everything lands in $OUT/tune.tar.gz (the device returns at most
# 8 files) beside summary.md:
#   1. parity: every ParityAttention test (the sparse MLA default, the indexer at every variant
#      and block size, 128 and 256 included).
#   2. the indexer rows (wgmma-e4m3 and wgmma-pipe for fp8, wgmma for bf16) at every block size
#      from 128 to 1024 tokens (DSA_CUDA_INDEXER_BLOCK_TOKENS), B = 1 (L = 128K) and B = 64
#      (L = 32K).
#   3. Nsight Compute on the wgmma64 sparse MLA kernel, bf16, B = 64 and B = 1: speed of light,
#      warp states, and the source page (stall samples per CUDA line) as CSV with its top lines
#      (bench/gpu/ncu_stalls.py); and on the fp8 indexer (wgmma-e4m3, the default) at B = 1 with
#      256-token blocks.
# Environment: OUT (default ./gpu-out), NCU (default: ncu on PATH, else /usr/local/cuda/bin/ncu).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup tune.log
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
P="$B/tests/dsa_parity_tests"
G="$B/bench/dsa_gpu_bench"
W="$OUT/work"
mkdir -p "$W"

step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
step parity-attention 240 "$P" --gtest_filter='ParityAttention.*' \
  --gtest_output="json:$W/parity-attention.json"

for tokens in 128 256 512 1024; do
  step "indexer-fp8-$tokens" 40 env DSA_CUDA_INDEXER_BLOCK_TOKENS="$tokens" "$G" --skip-store \
    --skip-gemm --attention-only indexer_logits --indexer-variants wgmma-e4m3 wgmma-pipe wgmma \
    --indexer-rows 1 64 --json "$W/indexer-$tokens.json"
done

# ncu_source NAME ROWS REGEX [ENV...]: the 4th matching launch with the source counters, its
# report, then the source page as CSV.
ncu_source() {
  local name="$1" rows="$2" regex="$3"
  shift 3
  step "ncu-$name" 120 env "$@" "$NCU" --kernel-name-base mangled --kernel-name "regex:$regex" \
    --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --section LaunchStats --section Occupancy \
    --section MemoryWorkloadAnalysis --import-source yes -f -o "$W/$name" \
    "$G" --skip-store --skip-gemm --attention-only sparse_mla --sparse-mla-rows "$rows"
  step "ncu-$name-csv" 60 bash -c "'$NCU' -i '$W/$name.ncu-rep' --page source --csv \
    --print-source cuda,sass > '$W/$name-source.csv'; '$NCU' -i '$W/$name.ncu-rep' \
    --page details > '$W/$name-details.txt'"
}
ncu_source mla64-bf16-b64 64 sparse_mla_wgmma64_kernel
ncu_source mla64-bf16-b1 1 sparse_mla_wgmma64_kernel
step ncu-indexer-fp8-b1 90 env DSA_CUDA_INDEXER_BLOCK_TOKENS=256 "$NCU" --kernel-name \
  regex:indexer_logits_wgmma_e4m3 --launch-skip 3 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy \
  --import-source yes -f -o "$W/indexer-fp8-b1" "$G" --skip-store --skip-gemm \
  --attention-only indexer_logits --indexer-variants wgmma-e4m3 --indexer-rows 1
step ncu-indexer-csv 60 bash -c "'$NCU' -i '$W/indexer-fp8-b1.ncu-rep' --page source --csv \
  --print-source cuda,sass > '$W/indexer-fp8-b1-source.csv'; '$NCU' -i \
  '$W/indexer-fp8-b1.ncu-rep' --page details > '$W/indexer-fp8-b1-details.txt'"

for name in mla64-bf16-b64 mla64-bf16-b1 indexer-fp8-b1; do
  step "stalls-$name" 30 bash -c "python3 bench/gpu/ncu_stalls.py '$W/$name-source.csv' 30 \
    > '$W/$name-stalls.txt'"
done
steps_summary "attention tuning" > "$OUT/summary.md"
rm -f "$W"/*.ncu-rep
cp "$LOG" "$OUT/steps.tsv" "$W/"
tar -czf "$OUT/tune.tar.gz" -C "$W" .
rm -rf "$W" "$LOG" "$OUT/steps.tsv"
cat "$OUT/summary.md"
