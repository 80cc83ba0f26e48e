// What the CUDA backend exposes beyond dsa::Backend, for benchmarks and tools that launch their
// own work next to the backend's. Includes no fmt, so .cu files may include it too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsa/backend.h"

namespace dsa {

// The stream every op of a CUDA backend runs on. Throws kInvalidArgument for another backend.
cudaStream_t cuda_stream(Backend& backend);

namespace cuda {

// Which batch-invariant GEMM kernel runs. kMma: mma.sync m16n8k16 (gemm_tensor.cu), every
// layout and fp8 weights. kWgmma: Hopper wgmma m64nNk16 (gemm_wgmma.cu, gemm_wgmma_tma.cu) for
// bf16 kNK weights, mma.sync for kKN and fp8 weights (the choice follows the layout and the
// weight dtype, never m). kDefault: the backend's choice, from the environment variable
// DSA_CUDA_GEMM ("mma" or "wgmma") when set, else kDefaultGemmKernel (wgmma: at cuBLASLt's
// speed at decode sizes on the H200, bench/results/2026-12-04-h200-gemm-tma.md). The two
// kernels give different bits (each one batch-invariant), so a run keeps one.
enum class GemmKernel { kDefault = -1, kMma = 0, kWgmma = 1 };
inline constexpr GemmKernel kDefaultGemmKernel = GemmKernel::kWgmma;
const char* gemm_kernel_name(GemmKernel kernel);  // "mma", "wgmma" or "default"

// The batch-invariant GEMM's knobs (gemm_tensor.cu, gemm_wgmma.cu), for the sweep of
// dsa_gpu_bench --gemm-sweep and the parity tests; the defaults follow the tables in the two
// files. kernel: see GemmKernel. tile: an index below gemm_invariant_tile_count(kernel) used for
// every call, or -1 for the kernel's pick by m. splits: the number of K slices for every shape,
// or 0 for the table's per-shape count; either way never a function of m, so the GEMM stays
// batch-invariant under any tuning (a different split count gives different bits, the same for
// every m). reduce: -1 default (the backend's, DSA_CUDA_GEMM_REDUCE; unset: the cluster reduction
// where it runs and pays, gemm_invariant.cu's cluster_pays, else as 3), 0 the separate reduce
// kernel, 1 the fused last-CTA reduction (when the output tiles fit its counters), 2 the cluster
// reduction wherever it runs (the bulk-copy kernels, batch 1, 2 to 8 slices: the slices' CTAs
// sum in distributed shared memory), else as 3, the reduction through L2 (fused for small output
// tiles, else the separate kernel); the same bits, every one.
// fp8: which kernel runs fp8 weights (GemmParams::w_fp8) when `kernel` is wgmma: -1 the backend's
// choice (DSA_CUDA_GEMM_FP8=mma|wgmma, unset: mma), 0 mma.sync, 1 the wgmma kernel's fp8 tiles
// (gemm_wgmma_fp8.cu: the bits of the wgmma kernel on the dequantized matrix), where
// gemm_invariant_fp8_runs_wgmma holds, else mma.sync. fp8_tile: one of those tiles for every call
// (-1: the backend's, DSA_CUDA_GEMM_FP8_TILE, unset: by m and n). Opt-in: slower than bf16
// weights on the H200 so far.
struct GemmInvariantTuning {
  int tile = -1;
  int splits = 0;
  int reduce = -1;
  GemmKernel kernel = GemmKernel::kDefault;
  int fp8 = -1;
  int fp8_tile = -1;
  // kKN weights (kv_b's absorb) under the wgmma kernel: 0 on mma.sync, 1 on the wgmma kernel's
  // bulk-copy tiles read MN-major (-1 unset: the backend's, DSA_CUDA_GEMM_KN, by default 1);
  // kn_tile names one of those tiles.
  int kn = -1;
  int kn_tile = -1;
  // fp8 activations (GemmParams::x_fp8): one of gemm_w8a8.cu's tiles for every call (-1: by m).
  int w8a8_tile = -1;
};
// Tile configurations of a kernel (kDefault: kDefaultGemmKernel's).
int gemm_invariant_tile_count(GemmKernel kernel = GemmKernel::kMma);
// "16x64.k128.s4" (mma: rows x cols, k per stage, stages), "8x64.s8" (wgmma: rows x cols,
// stages); "default" for an unknown index.
const char* gemm_invariant_tile_name(int tile, GemmKernel kernel = GemmKernel::kMma);
// The tile's rows of x (0 for an unknown index).
int gemm_invariant_tile_rows(int tile, GemmKernel kernel = GemmKernel::kMma);
// The CTAs of a cluster that share each x tile (2: the wgmma kernel's .mc2 tiles; else 1).
int gemm_invariant_tile_pair(int tile, GemmKernel kernel = GemmKernel::kMma);
// Launches of the wgmma kernel's bulk-copy tiles that ran the cp.async tile of the same shape
// instead, since the process started (the same bits; a probe for tests and benches).
uint64_t gemm_invariant_bulk_copy_fallbacks();
// What a call would use: the split count for (n, k, batch) and the tile index for m rows (of
// the kernel the tuning names; kDefault: kDefaultGemmKernel).
int gemm_invariant_splits(int n, int k, int batch, const GemmInvariantTuning& tuning);
int gemm_invariant_tile(int m, int n, int k, int batch, const GemmInvariantTuning& tuning);
// Whether a call of m rows sums its split partials by the cluster reduction: a bf16 kNK call,
// batch 1, whose operands the copy engine reads; a w8a8 call.
bool gemm_invariant_cluster_reduces(int m, int n, int k, const GemmInvariantTuning& tuning);
bool gemm_invariant_w8a8_cluster_reduces(int m, int n, int k, const GemmInvariantTuning& tuning);
// fp8 weights on the wgmma kernel: the tuning (kernel wgmma, fp8 1) asks for it, the weights are
// kNK, one batch entry, 16-byte aligned with a row stride of a multiple of 16 bytes, and K is a
// multiple of 8 (x then has 16-byte rows: the backend stages a bf16 copy that has not). A
// function of the weights and K alone, never of m: the fp8 bits of a shape never change with the
// batch. The fp8 tiles' count and names.
bool gemm_invariant_fp8_runs_wgmma(const GemmParams& p, const GemmInvariantTuning& tuning);
int gemm_invariant_fp8_tile_count();
const char* gemm_invariant_fp8_tile_name(int tile);
int gemm_invariant_fp8_tile(int m, int n, int k,
                            const GemmInvariantTuning& tuning);  // m rows' tile
// kKN weights on the wgmma kernel: the tuning (kernel wgmma, kn 1) asks for it, the weights are
// bf16 kKN that the copy engine can read (16-byte aligned, row and batch strides multiples of 8)
// and K is a multiple of 8 (the bf16 x the backend stages then has 16-byte rows). A function of
// the weights and K alone, never of m. The tile m rows take (an index among the bulk-copy
// tiles) and its name.
bool gemm_invariant_kn_runs_wgmma(const GemmParams& p, const GemmInvariantTuning& tuning);
int gemm_invariant_kn_tile(int m, const GemmInvariantTuning& tuning);
int gemm_invariant_kn_tile_count();
const char* gemm_invariant_kn_tile_name(int tile);
// fp8 activations (GemmParams::x_fp8, w8a8): whether the e4m3 kernel can run the call (kNK fp8
// weights, one batch entry, 16-byte aligned with a row stride and K multiples of 16: what the copy
// engine reads; a function of the weights and K, never of m), its tiles and the one m rows take.
bool gemm_invariant_w8a8_runs(const GemmParams& p);
int gemm_invariant_w8a8_tile_count();
const char* gemm_invariant_w8a8_tile_name(int tile);
int gemm_invariant_w8a8_tile(int m, const GemmInvariantTuning& tuning);

}  // namespace cuda

// Sets the knobs of a CUDA backend's batch-invariant GEMM (benches only; the default is the
// table). Throws kInvalidArgument for another backend or a tile index out of range.
void set_gemm_invariant_tuning(Backend& backend, const cuda::GemmInvariantTuning& tuning);

namespace cuda {

// out_b[r, :] = bf16(x_b[r, :cols]) for the fast (cuBLASLt) GEMM path: out is dense, [batch][rows,
// cols], batch stride rows * cols. elementwise.cu.
cudaError_t convert_to_bf16(const float* x, int rows, int cols, int64_t ld_x, int batch,
                            int64_t batch_stride_x, Bf16* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace dsa
