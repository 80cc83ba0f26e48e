#!/usr/bin/env bash
# Nsight Compute on the wgmma fp8-weight GEMM kernel, for tuning: one launch of it in the V3.2
# layer's B = 1 step (bench-decode --weights fp8 with DSA_CUDA_GEMM_FP8=wgmma), the o projection
# (m = 1, n = 7168, k = 16384: the sixth fp8-weight GEMM of the step), with the speed-of-light,
# warp-state and scheduler sections and the per-line stall samples. Runs ON the device, from the
# repository root, with the build of scripts/gpu-build.sh carried; about 2 minutes. Files in
# $OUT: profile.log, fp8w-o.ncu-rep, fp8w-o-source.csv (the CUDA line beside each SASS
# instruction, with its stall samples), fp8w-o-stalls.txt (bench/gpu/ncu_stalls.py over it: the
# lines with the most stall samples and their three largest reasons), summary.md.
# Environment: OUT (default ./gpu-out), NCU (default: ncu on PATH, else /usr/local/cuda/bin/ncu),
# SKIP (launches of the kernel to skip; default 5, the o projection), DSA_CUDA_GEMM_FP8_TILE (one
# fp8 tile for every fp8 GEMM, e.g. fp8r.8x128.s6: the profiled launch is then that tile's kernel).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup profile.log
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"

step ncu-fp8w-o 120 env DSA_CUDA_GEMM_FP8=wgmma "$NCU" --kernel-name-base mangled \
  --kernel-name 'regex:gemm_wgmma_fp8_(roles_)?kernel' --launch-skip "${SKIP:-5}" --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section SourceCounters --import-source yes -f -o "$OUT/fp8w-o" \
  "$B/dsa" bench-decode --backend cuda --preset v32 --layers 1 --batches 1 --context 4096 \
  --iters 1 --gemm invariant --weights fp8
step ncu-details 30 "$NCU" -i "$OUT/fp8w-o.ncu-rep" --page details
step ncu-source-csv 60 bash -c "'$NCU' -i '$OUT/fp8w-o.ncu-rep' --page source --csv \
  --print-source cuda,sass > '$OUT/fp8w-o-source.csv'"
step ncu-stalls 30 bash -c "python3 bench/gpu/ncu_stalls.py '$OUT/fp8w-o-source.csv' 30 \
  > '$OUT/fp8w-o-stalls.txt'"
steps_summary "fp8-weight wgmma GEMM profile" | tee "$OUT/summary.md"
