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

// The batch-invariant GEMM's knobs (gemm_tensor.cu), for the sweep of dsa_gpu_bench
// --gemm-sweep; the defaults follow the table in gemm_tensor.cu. tile: an index below
// gemm_invariant_tile_count() used for every call, or -1 for the table's pick by m. splits: the
// number of K slices for every shape, or 0 for the table's per-shape count; either way never a
// function of m, so the GEMM stays batch-invariant under any tuning (a different split count
// gives different bits, the same for every m). reduce: -1 default, 0 the separate reduce
// kernel, 1 the fused last-CTA reduction (when the output tiles fit its counters); the same bits.
struct GemmInvariantTuning {
  int tile = -1;
  int splits = 0;
  int reduce = -1;
};
int gemm_invariant_tile_count();
const char* gemm_invariant_tile_name(
    int tile);                           // "16x64.k128.s4": rows x cols, k per stage, stages
int gemm_invariant_tile_rows(int tile);  // the tile's rows (0 for an unknown index)
// What a call would use: the split count for (n, k, batch) and the tile index for m rows.
int gemm_invariant_splits(int n, int k, int batch, const GemmInvariantTuning& tuning);
int gemm_invariant_tile(int m, int n, int k, int batch, const GemmInvariantTuning& tuning);

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
