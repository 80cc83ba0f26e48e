// The consumer side both wgmma GEMM kernels share (gemm_wgmma.cu: cp.async stages;
// gemm_wgmma_tma.cu: bulk-copy stages): the accumulators of one warpgroup (kNSub instructions of
// N = kN per k16 block, 64 features), one stage's chain steps, and the store of the chains. What
// they compute is gemm_wgmma.cu's header, 2.: one chain of wgmma.m64nNk16 per element, from +0,
// over the slice's k16 blocks in ascending order.
#pragma once

#include <cooperative_groups.h>

#include <atomic>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {

inline constexpr int kWgmmaStageK = 64;  // k per stage: one 128-byte swizzled row

// The CTAs of a cluster along the features that share each x tile (C::kPair where the
// configuration names one, else 1): each brings 1/kPair of the stage's x rows into all of them
// with one multicast copy (gemm_wgmma_tma.cu).
template <class C>
constexpr int pair_of() {
  if constexpr (requires { C::kPair; }) {
    return C::kPair;
  } else {
    return 1;
  }
}

// The grid of a tile configuration C: x row tiles, y feature tiles (a whole number of pairs:
// pair_of), z batch entries x slices.
template <class C>
dim3 wgmma_grid(const TcParams& p) {
  constexpr int kPair = pair_of<C>();
  return dim3(ceil_div(p.m, C::kRows), ceil_div(ceil_div(p.n, C::kCols), kPair) * kPair,
              unsigned(p.batch * p.splits));
}

// The tensor map of x [batch][m][k] for C's x tiles (kRows rows of 64 k, swizzled): rows past m
// and k past K read as +0. False when the copy engine cannot take x (alignment).
template <class C>
bool encode_x_map(CUtensorMap* map, const TcParams& p) {
  return p.vec_x && encode_tile_map(map, TileMap::kBf16Swizzle128, p.x, p.k, p.m, p.batch, p.ld_x,
                                    p.bs_x, kWgmmaStageK, C::kRows);
}

// launch_kernel with the grid's blocks grouped in clusters of `cluster` (cluster_dimension; a
// cluster past the portable 8 blocks is not asked for).
template <typename... Expected, typename... Actual>
cudaError_t launch_kernel_in_clusters(void (*kernel)(Expected...), dim3 grid, dim3 block,
                                      size_t smem, dim3 cluster, cudaStream_t stream,
                                      Actual&&... args) {
  cudaLaunchConfig_t config = kernel_config(grid, block, smem, stream);
  cudaLaunchAttribute attrs[2] = {cluster_dimension(cluster.x, cluster.y, cluster.z), {}};
  config.attrs = attrs;
  config.numAttrs = 1;
  add_pdl_attribute(config, attrs);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Actual>(args)...);
}

// A bulk-copy kernel instance on its two tensor maps: the opt-in, then the launch on C's grid,
// its splits in clusters when p.cluster (grid z is then the splits: batch 1), its pairs' feature
// tiles in clusters when C has pairs (which never take p.cluster).
template <class C, class Kernel>
cudaError_t launch_on_maps(cudaError_t (*opt_in)(bool), Kernel kernel, const CUtensorMap& a,
                           const CUtensorMap& b, const TcParams& p, cudaStream_t stream) {
  if (const cudaError_t err = opt_in(false); err != cudaSuccess) return err;
  if constexpr (pair_of<C>() > 1) {
    if (p.cluster) return cudaErrorInvalidValue;
    const dim3 grid = wgmma_grid<C>(p);
    if (grid.y > 65535) return cudaErrorInvalidValue;
    launch_kernel_in_clusters(kernel, grid, C::kThreads, C::kSmemBytes,
                              dim3(1, unsigned(pair_of<C>()), 1), stream, a, b, p);
  } else if (p.cluster) {
    if (p.batch != 1 || p.splits < 2 || p.splits > kGemmClusterMaxSplits) {
      return cudaErrorInvalidValue;
    }
    launch_kernel_in_clusters(kernel, wgmma_grid<C>(p), C::kThreads, C::kSmemBytes,
                              dim3(1, 1, unsigned(p.splits)), stream, a, b, p);
  } else {
    launch_kernel(kernel, wgmma_grid<C>(p), C::kThreads, C::kSmemBytes, stream, a, b, p);
  }
  return cudaGetLastError();
}

// ---- The cluster reduction (TcParams::cluster) ----
// The p.splits CTAs of one output tile are one cluster (grid z). Each puts its slice's chains, as
// they would have gone to `partial`, into its own shared memory: a [kRows][kCols + 4] f32 tile
// over its freed stages (the pad of 4 spreads a warp's stores over the banks). After one cluster
// barrier, CTA r of the cluster sums the tile's 4-column pieces u with u % splits == r, reading
// each piece from the CTAs of slices 0, 1, ... in slice order with the additions of
// reduce_splits_kernel (sum = slice 0, then __fadd_rn of each next slice, then alpha, then the
// accumulation), and writes y; a second barrier keeps every CTA's tile alive until the others have
// read it. So the bits are those of the fused and the separate reduction, with no partial round
// trip through L2 and no counter.
template <int kRows, int kCols>
struct ClusterTile {
  static constexpr int kPitch = kCols + 4;
  static constexpr size_t kBytes = size_t(kRows) * kPitch * sizeof(float);
};

// The threads that do not reduce (the producer warpgroup): the two barriers of the reduction.
__device__ __forceinline__ void cluster_tile_bystander() {
  __syncwarp();  // the barrier is .aligned: the warp's lanes arrive together
  cluster_sync();
  cluster_sync();
}

// The reduction by the kThreads consumer threads (tid < kThreads), their chains already in
// `tile` (this CTA's shared memory, ClusterTile<kRows, kCols>'s layout, rows from row0, columns
// from col0).
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void reduce_cluster_tile(const TcParams& p, int row0, int col0,
                                                    const float* tile, int tid) {
  namespace cg = cooperative_groups;
  using T = ClusterTile<kRows, kCols>;
  constexpr int kRowQuads = kCols / 4, kQuads = kRows * kRowQuads;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), splits = p.splits;
  cluster_sync();  // every CTA's chains are in its tile
  for (int u = rank + splits * tid; u < kQuads; u += splits * kThreads) {
    const int r = u / kRowQuads, c = 4 * (u % kRowQuads);
    const int row = row0 + r, col = col0 + c;
    if (row >= p.m || col >= p.n) continue;
    const float* at = tile + r * T::kPitch + c;
    float4 v[kGemmClusterMaxSplits];
#pragma unroll
    for (int s = 0; s < kGemmClusterMaxSplits; ++s) {
      if (s < splits) {
        v[s] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(at, s));
      }
    }
    float4 sum = v[0];
#pragma unroll
    for (int s = 1; s < kGemmClusterMaxSplits; ++s) {
      if (s < splits) {
        sum.x = __fadd_rn(sum.x, v[s].x), sum.y = __fadd_rn(sum.y, v[s].y);
        sum.z = __fadd_rn(sum.z, v[s].z), sum.w = __fadd_rn(sum.w, v[s].w);
      }
    }
    float* out = p.y + int64_t(row) * p.ld_y + col;
    const float e[4] = {sum.x, sum.y, sum.z, sum.w};
    for (int i = 0; i < 4 && col + i < p.n; ++i) finish_element(p, out + i, e[i]);
  }
  __syncwarp();
  cluster_sync();  // every CTA has read this one's tile
}

// The consumers' side of the cluster reduction, for a kernel of tile configuration C: once every
// consumer's wgmma has read its stages (named barrier 1 among the 128 * C::kConsumers consumer
// threads, the first of the CTA; the producer's copies had all landed), put(tile, pitch) writes
// this thread's chains into the cluster tile laid over the stages at `stages`, then the reduction.
template <class C, class Put>
__device__ __forceinline__ void reduce_chains_in_cluster(const TcParams& p, int row0, int col0,
                                                         void* stages, Put&& put) {
  using T = ClusterTile<C::kRows, C::kCols>;
  static_assert(T::kBytes <= size_t(C::kStages) * C::kStageBytes, "the tile fits the stages");
  constexpr int kThreads = 128 * C::kConsumers;
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  float* tile = static_cast<float*>(stages);
  put(tile, T::kPitch);
  reduce_cluster_tile<C::kRows, C::kCols, kThreads>(p, row0, col0, tile, int(threadIdx.x));
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

// kMnA: the warpgroup's weight tile is MN-major ([64 k rows][64 features], 128-byte swizzled:
// kKN weights as the copy engine brings them) instead of K-major; the instruction reads it
// transposed (imm-trans-a), so each element's chain is the same sequence of k16 blocks.
template <int kN, int kNSub, bool kMnA = false>
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
      // K-major: k16 block kk 32 bytes into each row; MN-major: 16 k rows (two atoms) further,
      // the 64 features of a k in one row (the LBO, between 64-feature groups, unused).
      const uint64_t desc_a =
          kMnA ? wgmma_desc_sw128_mn(a_tile + uint32_t(kk * 2 * kSwizzleAtomBytes),
                                     64 * kSwizzleRowBytes)
               : wgmma_desc_sw128(a_tile + 32 * kk);
#pragma unroll
      for (int j = 0; j < kNSub; ++j) {
        const uint32_t rows = uint32_t(j * kN * kSwizzleRowBytes);
        wgmma_bf16<kN, kMnA ? 1 : 0>(acc[j], desc_a, wgmma_desc_sw128(b_tile + rows + 32 * kk));
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
  // f(r, c, value) for every chain of this thread: r the row of x among the CTA's (j kN + 8 block
  // + 2 q (+ 1)), c the feature among the warpgroup's 64 (16 warp + g (+ 8)); the D fragment of
  // wgmma.cuh.
  template <class F>
  __device__ __forceinline__ void each(F&& f) const {
    const int t = int(threadIdx.x) % 128, warp = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
    for (int j = 0; j < kNSub; ++j) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        const int block = i / 4, e = i % 4;
        f(j * kN + 8 * block + 2 * q + e % 2, 16 * warp + g + 8 * (e / 2), acc[j][i]);
      }
    }
  }
  // The chains into a cluster tile (ClusterTile<rows, cols>: pitch floats a row), this
  // warpgroup's features from column col (its offset in the CTA's tile); every element, in range
  // or not.
  __device__ __forceinline__ void put(float* tile, int pitch, int col) const {
    each([&](int r, int c, float v) { tile[r * pitch + col + c] = v; });
  }
  // The chains of rows [row0, row0 + kN * kNSub) x features [col0, col0 + 64) (col0 already this
  // warpgroup's) to y or slice s's partial; nothing at or past m or n.
  __device__ __forceinline__ void store(const TcParams& p, int b, int s, int row0, int col0) const {
    each([&](int r, int c, float v) {
      if (row0 + r < p.m && col0 + c < p.n) store_chain(p, b, s, row0 + r, col0 + c, v);
    });
  }
};

// What a CTA of the bulk-copy kernels works on (grid: wgmma_grid): batch entry b, K slice s, rows
// [row0, row0 + C::kRows) (row tiles are the fastest grid index: the CTAs that share a weight
// tile run side by side), features [col0, col0 + C::kCols), k [k_begin, k_begin + k_len) in
// `tiles` stages; and this thread's warpgroup wg, read through a shuffle so that the compiler
// knows it is warp-uniform (else it serializes the consumers' wgmma as if the role could
// diverge).
struct WgmmaCta {
  int b, s, row0, col0, k_begin, k_len, tiles, wg;
  template <class C>
  __device__ __forceinline__ static WgmmaCta of(const TcParams& p) {
    WgmmaCta c;
    c.b = int(blockIdx.z) % p.batch, c.s = int(blockIdx.z) / p.batch;
    c.row0 = int(blockIdx.x) * C::kRows, c.col0 = int(blockIdx.y) * C::kCols;
    c.k_begin = c.s * p.slice_k;
    c.k_len = min(p.k, c.k_begin + p.slice_k) - c.k_begin;
    c.tiles = (c.k_len + kWgmmaStageK - 1) / kWgmmaStageK;
    c.wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
    return c;
  }
};

// Thread 0 sets the ring's barriers up (full: one arrival plus the copies' bytes; empty: one
// arrival per consumer warpgroup of each CTA that writes the stage, pair_of<C>() of them) and
// prefetches the two tensor maps; every thread of the CTA calls it and leaves after the setup.
template <class C>
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, const CUtensorMap* a,
                                          const CUtensorMap* b) {
  if (threadIdx.x == 0) {
    for (int st = 0; st < C::kStages; ++st) {
      mbar_init(&full[st], 1);
      mbar_init(&empty[st], C::kConsumers * pair_of<C>());
    }
    mbar_init_fence();
    tma_prefetch_map(a);
    tma_prefetch_map(b);
  }
  __syncthreads();
}

// The producer's claim on stage st for tile kt: the stage's previous use released (empty), then
// `bytes` of copies expected on full[st]; returns st.
template <class C>
__device__ __forceinline__ int claim_stage(uint64_t* full, uint64_t* empty, int kt,
                                           uint32_t bytes) {
  const int st = kt % C::kStages, use = kt / C::kStages;
  // A pair's stage is written by both CTAs' copies: both CTAs' consumers must be done with it.
  if (use > 0) {
    mbar_wait<(pair_of<C>() > 1)>(&empty[st], uint32_t(use - 1) & 1u);
  }
  mbar_arrive_expect_tx(&full[st], bytes);
  return st;
}

// The producer thread's loop over a CTA's `tiles` stages: per stage kt, its claim (claim_stage,
// `bytes` expected), then load_w(kt, st) and load_x(kt, st), the copies of the weight and x tiles.
// With p.w_early the weight copies of the first kStages stages (no claim waits for them: their
// stages are fresh) go before the programmatic wait, overlapping the kernel before this one;
// every x copy follows it (pdl.h).
template <class C, class LoadW, class LoadX>
__device__ __forceinline__ void produce_stages(const TcParams& p, uint64_t* full, uint64_t* empty,
                                               int tiles, uint32_t bytes, LoadW&& load_w,
                                               LoadX&& load_x) {
  const int early = p.w_early ? min(tiles, C::kStages) : 0;
  for (int kt = 0; kt < early; ++kt) load_w(kt, claim_stage<C>(full, empty, kt, bytes));
  pdl_wait();
  for (int kt = 0; kt < tiles; ++kt) {
    const int st = kt < early ? kt : claim_stage<C>(full, empty, kt, bytes);
    if (kt >= early) load_w(kt, st);
    load_x(kt, st);
  }
}

// A consumer warpgroup of the bulk-copy kernels (gemm_wgmma_tma.cu, gemm_wgmma_fp8.cu), all of
// it: per stage, wait(kt, st, parity) until stage st (tile kt) may be read, run the chains over
// this warpgroup's 64 weight rows (the stage starts with the weight tile, C::kWBytes long, then the
// x tile; kMnA: as WgmmaChains), and release the stage before on empty (one arrival per
// warpgroup, once its wgmma group has completed); then the store, and the fused reduction among
// the consumers alone (named barrier 1: the producer warpgroup has left).
template <class C, bool kMnA = false, class Wait>
__device__ __forceinline__ void wgmma_consume(const TcParams& p, const WgmmaCta& cta,
                                              uint32_t smem_base, uint64_t* empty, Wait&& wait) {
  const int b = cta.b, s = cta.s, row0 = cta.row0, col0 = cta.col0, wg = cta.wg;
  const int k_len = cta.k_len;
  WgmmaChains<C::kN, C::kNSub, kMnA> chains;
  chains.zero();
  const bool leader = threadIdx.x % 128 == 0;
  [[maybe_unused]] const uint32_t peer =
      pair_of<C>() > 1 ? cooperative_groups::this_cluster().block_rank() ^ 1u : 0u;
  for (int kt = 0; kt < cta.tiles; ++kt) {
    const int st = kt % C::kStages;
    wait(kt, st, uint32_t(kt / C::kStages) & 1u);
    const uint32_t stage = smem_base + uint32_t(st * C::kStageBytes);
    chains.stage(stage + uint32_t(wg * 64 * kSwizzleRowBytes), stage + uint32_t(C::kWBytes),
                 k_len - kt * kWgmmaStageK);
    wgmma_wait<1>();  // the group of stage kt - 1 has completed: release its stage
    if (kt > 0 && leader) {
      uint64_t* bar = &empty[(kt - 1) % C::kStages];
      mbar_arrive(bar);
      // The other CTA of a pair writes its share of x into this stage too: it waits for us.
      if constexpr (pair_of<C>() > 1) mbar_arrive_remote(bar, peer);
    }
  }
  wgmma_wait<0>();
  chains.fence();
  if (p.cluster) {
    reduce_chains_in_cluster<C>(p, row0, col0, __cvta_shared_to_generic(size_t(smem_base)),
                                [&](float* tile, int pitch) { chains.put(tile, pitch, wg * 64); });
    return;
  }
  chains.store(p, b, s, row0, col0 + wg * 64);
  if (p.splits == 1 || !p.fused) return;
  finish_wgmma_tile<128 * C::kConsumers, 1>(p, b, row0, C::kRows, col0, C::kCols);
}

}  // namespace dsa::cuda
