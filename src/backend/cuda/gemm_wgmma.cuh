// The consumer side both wgmma GEMM kernels share (gemm_wgmma.cu: cp.async stages;
// gemm_wgmma_tma.cu: bulk-copy stages): the accumulators of one warpgroup (kNSub instructions of
// N = kN per k16 block, 64 features), one stage's chain steps, and the store of the chains. What
// they compute is gemm_wgmma.cu's header, 2.: one chain of wgmma.m64nNk16 per element, from +0,
// over the slice's k16 blocks in ascending order.
#pragma once

#include <atomic>

#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {

inline constexpr int kWgmmaStageK = 64;  // k per stage: one 128-byte swizzled row

// A tile configuration of either kernel: its shape, its launcher and its shared-memory opt-in.
struct WgmmaTileEntry {
  WgmmaTileInfo info;
  cudaError_t (*launch)(const TcParams&, cudaStream_t);
  cudaError_t (*opt_in)(bool force);
};

// The grid of a tile configuration C: x row tiles, y feature tiles, z batch entries x slices.
template <class C>
dim3 wgmma_grid(const TcParams& p) {
  return dim3(ceil_div(p.m, C::kRows), ceil_div(p.n, C::kCols), unsigned(p.batch * p.splits));
}

// The shared-memory opt-in of a kernel instance, once per device (force: again).
template <auto kKernel, int kSmemBytes>
cudaError_t wgmma_opt_in(bool force) {
  static std::atomic<uint64_t> opted_in{0};
  return opt_in_smem(reinterpret_cast<const void*>(kKernel), kSmemBytes, force, opted_in);
}

// The fused split reduction of this CTA's output tile, rows [row0, row0 + rows) x features
// [col0, col0 + cols) clipped to m and n (grid: x row tiles, y feature tiles, z batch x slices);
// one counter per (batch entry, feature tile, row tile), the same for every slice of the tile.
template <int kThreads, int kBarrier = 0>
__device__ __forceinline__ void finish_wgmma_tile(const TcParams& p, int b, int row0, int rows,
                                                  int col0, int cols) {
  const int64_t tile = (int64_t(b) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  finish_split_tile<kThreads, kBarrier>(p, b, tile, row0, min(rows, p.m - row0), col0,
                                        min(cols, p.n - col0));
}

template <int kN, int kNSub>
struct WgmmaChains {
  static constexpr int kStageK = kWgmmaStageK;
  float acc[kNSub][kN / 2];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int j = 0; j < kNSub; ++j) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) acc[j][i] = 0.0f;
    }
  }
  __device__ __forceinline__ void fence() {
#pragma unroll
    for (int j = 0; j < kNSub; ++j) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) fence_operand(acc[j][i]);
    }
  }
  // One stage's k16 blocks in ascending order, committed as one group: all four when the slice
  // goes on past the stage (straight-line code), else those below the slice end (k_valid > 0
  // columns of k left). a_tile: this warpgroup's 64 weight rows; b_tile: the stage's x rows,
  // kNSub groups of kN.
  __device__ __forceinline__ void stage(uint32_t a_tile, uint32_t b_tile, int k_valid) {
    auto issue = [&](int kk) {
      const uint64_t desc_a = wgmma_desc_sw128(a_tile + 32 * kk);
#pragma unroll
      for (int j = 0; j < kNSub; ++j) {
        const uint32_t rows = uint32_t(j * kN * kSwizzleRowBytes);
        wgmma_bf16<kN>(acc[j], desc_a, wgmma_desc_sw128(b_tile + rows + 32 * kk));
      }
    };
    fence();
    if (k_valid >= kStageK) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kStageK / 16; ++kk) issue(kk);
    } else {
      wgmma_fence();
      for (int kk = 0; 16 * kk < k_valid; ++kk) issue(kk);
    }
    wgmma_commit();
    fence();
  }
  // The chains of rows [row0, row0 + kN * kNSub) x features [col0, col0 + 64) (col0 already this
  // warpgroup's) to y or slice s's partial; nothing at or past m or n. D fragment (wgmma.cuh):
  // feature 16 warp + g (+ 8), batch row 8 block + 2 q (+ 1).
  __device__ __forceinline__ void store(const TcParams& p, int b, int s, int row0, int col0) {
    const int t = int(threadIdx.x) % 128, warp = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
    for (int j = 0; j < kNSub; ++j) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        const int block = i / 4, e = i % 4;
        const int col = col0 + 16 * warp + g + 8 * (e / 2);
        const int row = row0 + j * kN + 8 * block + 2 * q + e % 2;
        if (row < p.m && col < p.n) store_chain(p, b, s, row, col, acc[j][i]);
      }
    }
  }
};

}  // namespace dsa::cuda
