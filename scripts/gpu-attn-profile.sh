#!/usr/bin/env bash
# Nsight Compute on the sparse MLA kernel, for tuning: one launch each of bf16 and fp8 at B = 64
# (64 heads per CTA) and B = 1 (16 heads per CTA), with the speed-of-light, warp-state, scheduler,
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
profile ncu-bf16-b64 64 'KvDtypeE0ELi4E'
profile ncu-fp8-b64 64 'KvDtypeE1ELi4E'
profile ncu-bf16-b1 1 'KvDtypeE0ELi1E'
profile ncu-fp8-b1 1 'KvDtypeE1ELi1E'
steps_summary "sparse MLA profile" | tee "$OUT/summary.md"
