#!/usr/bin/env bash
# Nsight Compute on the sparse MLA kernels, for tuning: one launch each of the wgmma kernel (the
# default) at bf16 and fp8 B = 64 and bf16 B = 1, and of the mma.sync kernel (64 heads per CTA) at
# bf16 and fp8 B = 64, with the speed-of-light, warp-state, scheduler,
# memory-workload and occupancy sections. Runs ON the device, from the repository root, with the
# build of scripts/gpu-build.sh carried (build-gpu/{lib,bench}), in under 4 minutes. Optional:
# scripts/gpu-attn.sh is the check; this only explains its sparse MLA rows. Files in $OUT:
# profile.log (every step's output, ncu's tables included) and summary.md.
# Environment: OUT (default ./gpu-out), NCU (default: ncu on PATH, else /usr/local/cuda/bin/ncu).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup profile.log
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"

# profile NAME ROWS KERNEL_REGEX: the 4th matching launch (after the 3 warm-up calls) of the
# bench's sparse MLA rows at ROWS; the regex reads the mangled name: KvDtypeE0 bf16, E1 fp8;
# Li4E 64 heads per CTA, Li1E 16.
profile() {
  step "$1" 60 "$NCU" --kernel-name-base mangled --kernel-name "regex:$3" --launch-skip 3 \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis_Tables --section Occupancy --section LaunchStats \
    "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only sparse_mla \
    --sparse-mla-rows "$2"
}
# The wgmma kernel (the default): sparse_mla_wgmma_kernel<dtype, P V on wgmma (Lb1E; Lb0E is the
# mma.sync check path), schedule (E0 serial, E1 overlap)>.
profile ncu-wgmma-bf16-b64 64 'sparse_mla_wgmma_kernelILNS_7KvDtypeE0ELb1ELNS1_8ScheduleE0E'
profile ncu-wgmma-fp8-b64 64 'sparse_mla_wgmma_kernelILNS_7KvDtypeE1ELb1ELNS1_8ScheduleE0E'
profile ncu-wgmma-bf16-b1 1 'sparse_mla_wgmma_kernelILNS_7KvDtypeE0ELb1ELNS1_8ScheduleE0E'
# Where the default kernel's warps wait, per source line: the bf16 B = 64 launch again with the
# warp-state sampling (SourceCounters) into a report, then its source page as CSV (the
# CUDA line beside each SASS instruction, with its stall samples): mla-source.csv.
step ncu-wgmma-bf16-b64-source 90 "$NCU" --kernel-name-base mangled \
  --kernel-name 'regex:sparse_mla_wgmma_kernelILNS_7KvDtypeE0ELb1ELNS1_8ScheduleE0E' \
  --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats \
  --import-source yes -f -o "$OUT/mla-wgmma-bf16-b64" \
  "$B/bench/dsa_gpu_bench" --skip-store --skip-gemm --attention-only sparse_mla --sparse-mla-rows 64
step ncu-source-csv 60 bash -c "'$NCU' -i '$OUT/mla-wgmma-bf16-b64.ncu-rep' --page source --csv \
  --print-source cuda,sass > '$OUT/mla-source.csv'"
# The mma.sync kernel (DSA_CUDA_SPARSE_MLA_VARIANT=mma rows of the bench): sparse_mla_kernel<dtype,
# m-tiles per CTA (Li4E: 64 heads, Li1E: 16)>.
profile ncu-bf16-b64 64 'sparse_mla_kernelILNS_7KvDtypeE0ELi4E'
profile ncu-fp8-b64 64 'sparse_mla_kernelILNS_7KvDtypeE1ELi4E'
steps_summary "sparse MLA profile" | tee "$OUT/summary.md"
