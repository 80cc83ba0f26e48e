// What the batch-invariant GEMM kernels share: gemm_tensor.cu (mma.sync, any layout),
// gemm_wgmma.cu, gemm_wgmma_tma.cu and gemm_wgmma_fp8.cu (Hopper wgmma, kNK weights), and
// gemm_invariant.cu (the entry point gemm_invariant, the split-K plan and the shape table, the
// reduction kernel). All run the contract of gemm_invariant.cu's header: y[m, n] is one chain of
// k16 tensor-core steps per K slice, from +0, in ascending k, the slices from split_plan (K, N,
// batch only) added in slice order; which kernel runs is chosen from the layout and the tuning,
// never from m.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mma.cuh"

namespace dsa::cuda {

struct TcParams {
  const uint16_t* x;   // bf16 bits [batch][m, k]: row stride ld_x, batch stride bs_x
  const uint16_t* w;   // bf16 bits [batch][n, k] (nk) or [batch][k, n], row stride ld_w
  float* y;            // [batch][m, n], row stride ld_y, batch stride bs_y
  float* partial;      // [splits][batch][m][n] when splits > 1
  unsigned* counters;  // one per output tile, zero at rest, when fused (splits > 1)
  int m, n, k, batch, splits, slice_k;
  int64_t ld_x, ld_w, ld_y, bs_x, bs_w, bs_y;
  float alpha;
  bool nk, accumulate, vec_x, vec_w, fused;
  // fp8 weights instead of w (mma.sync kernel, nk, batch 1; vec_w then says 16-byte cp.async):
  const uint8_t* w8;      // e4m3 bytes [n, k], row stride ld_w
  const float* w8_scale;  // [ceil(n / 128)][ceil(k / 128)], row stride ld_w8_scale
  int64_t ld_w8_scale;
  // fp8 activations (gemm_w8a8.cu, with w8): x's e4m3 codes [m, k] (row stride ld_x8 bytes) and
  // scales [ceil(k / 128)][ld_x8_scale] (transposed; rows [m, ld_x8_scale) reach no output).
  const uint8_t* x8 = nullptr;
  const float* x8_scale = nullptr;
  int64_t ld_x8 = 0, ld_x8_scale = 0;
  // The splits of an output tile are one cluster (grid z, batch 1, 2 to 8 splits; the bulk-copy
  // kernels only) and sum their chains in distributed shared memory (reduce_cluster_tile,
  // gemm_wgmma.cuh); partial and counters are then not touched.
  bool cluster = false;
  // The weights may be copied before the programmatic wait (GemmParams::w_constant; pdl.h).
  bool w_early = false;
};
inline constexpr int kGemmClusterMaxSplits = 8;  // TcParams::cluster: the portable cluster size

// 8 bf16 from s into the 16-byte-aligned d: cp.async when all are in range and aligned, else
// element loads with zero fill (nothing is read for an out-of-range element).
__device__ __forceinline__ void load_chunk(uint16_t* d, const uint16_t* s, bool row_ok, int avail,
                                           bool vec) {
  if (!row_ok || avail <= 0) {
    *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  } else if (vec && avail >= 8) {
    cp_async16(d, s);
  } else {
    uint16_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i < avail ? s[i] : uint16_t(0);
    uint4 packed;
    packed.x = uint32_t(v[0]) | uint32_t(v[1]) << 16;
    packed.y = uint32_t(v[2]) | uint32_t(v[3]) << 16;
    packed.z = uint32_t(v[4]) | uint32_t(v[5]) << 16;
    packed.w = uint32_t(v[6]) | uint32_t(v[7]) << 16;
    *reinterpret_cast<uint4*>(d) = packed;
  }
}

// The last step of every way an output element is made: *out = alpha * sum (or *out + alpha *
// sum), sum being its one chain or its slices' sum.
__device__ __forceinline__ void finish_element(const TcParams& p, float* out, float sum) {
  const float scaled = __fmul_rn(p.alpha, sum);
  *out = p.accumulate ? __fadd_rn(*out, scaled) : scaled;
}

// One element of the output (row < m, col < n) from its slice's chain: y = alpha * acc (or
// y + alpha * acc) with one slice, else the chain goes to slice s's partial.
__device__ __forceinline__ void store_chain(const TcParams& p, int b, int s, int row, int col,
                                            float acc) {
  if (p.splits == 1) {
    finish_element(p, p.y + int64_t(b) * p.bs_y + int64_t(row) * p.ld_y + col, acc);
  } else {
    p.partial[((int64_t(s) * p.batch + b) * p.m + row) * p.n + col] = acc;
  }
}

// The fused split reduction, called by every thread of a CTA after its partial stores when
// p.fused: the last CTA of output tile `tile` (rows [row0, row0 + rows) x columns [col0,
// col0 + cols) of batch entry b) to arrive, whatever its slice, sums the tile's partials in
// slice order 0, 1, ..., exactly as reduce_splits_kernel does, so which CTA comes last never
// changes a bit. Release: every thread fences its partial stores before thread 0 counts the
// arrival; acquire: the last CTA fences again and reads the partials from L2.
// kBarrier 0: every thread of the CTA calls it (kThreads of them); else threads [0, kThreads)
// do, and synchronize on named barrier kBarrier (the others have left: warp-specialized kernels).
template <int kThreads, int kBarrier = 0>
__device__ __forceinline__ void finish_split_tile(const TcParams& p, int b, int64_t tile, int row0,
                                                  int rows, int col0, int cols) {
  __shared__ bool last;
  auto sync = [] {
    if constexpr (kBarrier == 0) {
      __syncthreads();
    } else {
      asm volatile("bar.sync %0, %1;\n" ::"n"(kBarrier), "n"(kThreads) : "memory");
    }
  };
  __threadfence();
  sync();
  unsigned* counter = p.counters + tile;
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == unsigned(p.splits - 1);
    if (last) *counter = 0;  // every slice has arrived: zero again for the next launch
  }
  sync();
  if (!last) return;
  __threadfence();
  const int64_t per_slice = int64_t(p.batch) * p.m * p.n;
  // Four columns at a time when every address allows 16-byte accesses, each element's slices
  // still added in slice order, four slices' loads in flight before their additions.
  const bool vec =
      ((cols | col0 | p.n) & 3) == 0 && (p.ld_y & 3) == 0 && (p.batch == 1 || (p.bs_y & 3) == 0) &&
      ((reinterpret_cast<uintptr_t>(p.y) | reinterpret_cast<uintptr_t>(p.partial)) & 15) == 0;
  if (vec) {
    auto add4 = [](float4& a, const float4& v) {
      a.x = __fadd_rn(a.x, v.x), a.y = __fadd_rn(a.y, v.y);
      a.z = __fadd_rn(a.z, v.z), a.w = __fadd_rn(a.w, v.w);
    };
    const int quads = cols / 4;
    for (int e = threadIdx.x; e < rows * quads; e += kThreads) {
      const int row = row0 + e / quads, col = col0 + 4 * (e % quads);
      const float* part = p.partial + (int64_t(b) * p.m + row) * p.n + col;
      auto slice = [&](int sl) {
        return __ldcg(reinterpret_cast<const float4*>(part + sl * per_slice));
      };
      float4 sum = slice(0);
      int sl = 1;
      for (; sl + 3 < p.splits; sl += 4) {
        const float4 v0 = slice(sl), v1 = slice(sl + 1), v2 = slice(sl + 2), v3 = slice(sl + 3);
        add4(sum, v0), add4(sum, v1), add4(sum, v2), add4(sum, v3);
      }
      for (; sl < p.splits; ++sl) add4(sum, slice(sl));
      float4* out =
          reinterpret_cast<float4*>(p.y + int64_t(b) * p.bs_y + int64_t(row) * p.ld_y + col);
      float4 scaled = make_float4(__fmul_rn(p.alpha, sum.x), __fmul_rn(p.alpha, sum.y),
                                  __fmul_rn(p.alpha, sum.z), __fmul_rn(p.alpha, sum.w));
      if (p.accumulate) {
        float4 prev = *out;
        add4(prev, scaled);
        scaled = prev;
      }
      *out = scaled;
    }
    return;
  }
  for (int e = threadIdx.x; e < rows * cols; e += kThreads) {
    const int row = row0 + e / cols, col = col0 + e % cols;
    const float* part = p.partial + (int64_t(b) * p.m + row) * p.n + col;
    float sum = __ldcg(part);
    for (int sl = 1; sl < p.splits; ++sl) sum = __fadd_rn(sum, __ldcg(part + sl * per_slice));
    finish_element(p, p.y + int64_t(b) * p.bs_y + int64_t(row) * p.ld_y + col, sum);
  }
}

// Slices of K start on multiples of kGemmSliceGranule (split_plan), which is also the fp8 scale
// block: a slice starts on a scale block, and every kernel's k per stage divides it.
inline constexpr int kGemmSliceGranule = 128;
// fp8 weights on mma.sync: the most 128-wide k blocks of one slice (slice_k <= 32768) whose
// scales a CTA keeps in shared memory; gemm_invariant refuses a plan with longer slices.
inline constexpr int kGemmFp8MaxSliceBlocks = 256;

// A tile configuration of one of the kernels: `rows` of x by `cols` output features per CTA,
// its launcher and its shared-memory opt-in (once per device; force: again).
struct GemmTileInfo {
  const char* name;
  int rows, cols;
  int pair = 1;  // CTAs of a cluster sharing each x tile (gemm_wgmma_tma.cu's .mc2 tiles: 2)
};
struct GemmTileEntry {
  GemmTileInfo info;
  cudaError_t (*launch)(const TcParams&, cudaStream_t);
  cudaError_t (*opt_in)(bool force);
};
// A kernel's tile table: the info of an index ("default" past the end), every opt-in.
template <size_t kCount>
GemmTileInfo tile_info_in(const GemmTileEntry (&tiles)[kCount], int tile) {
  return tile >= 0 && tile < int(kCount) ? tiles[tile].info : GemmTileInfo{"default", 0, 0};
}
template <size_t kCount>
cudaError_t opt_in_all(const GemmTileEntry (&tiles)[kCount]) {
  for (const GemmTileEntry& tile : tiles) {
    if (const cudaError_t err = tile.opt_in(true); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// ---- gemm_tensor.cu (mma.sync: every layout, fp8 weights) ----
int mma_tile_count();
GemmTileInfo mma_tile_info(int tile);
cudaError_t mma_launch(const TcParams& p, int tile, cudaStream_t stream);
cudaError_t mma_prepare();

// ---- gemm_wgmma.cu (kNK weights only; gemm_invariant dispatches) ----

int wgmma_tile_count();
GemmTileInfo wgmma_tile_info(int tile);
// The tile for m rows of a shape whose plan has `splits` slices (any function of anything: the
// tile never changes a bit; gemm_wgmma.cu's header).
int wgmma_pick_tile(int m, int n, int batch, int splits);
// p.cluster: only the bulk-copy tiles run it; cudaErrorNotSupported (nothing launched) when the
// tile is a cp.async one or the copy engine cannot take the operands.
cudaError_t wgmma_launch(const TcParams& p, int tile, cudaStream_t stream);
bool wgmma_tile_is_bulk_copy(int tile);  // gemm_wgmma_tma.cu's tiles, which take p.cluster
// How many launches of a bulk-copy tile so far ran its cp.async tile instead (the copy engine
// could not take the operands).
uint64_t wgmma_bulk_copy_fallbacks();
cudaError_t wgmma_prepare();  // every tile's shared-memory opt-in, on the current device

// ---- gemm_wgmma_tma.cu (the same chains, fed by the bulk copy engine) ----
int wgmma_tma_tile_count();
GemmTileInfo wgmma_tma_tile_info(int tile);
// cudaErrorNotSupported, launching nothing, when the operands cannot be described to the copy
// engine (alignment): the caller then runs a cp.async tile of the same shape.
cudaError_t wgmma_tma_launch(const TcParams& p, int tile, cudaStream_t stream);
// The bulk-copy tile m rows of kKN weights take (p.nk false: the same tiles, the weights read
// MN-major; any tile gives the same bits).
int wgmma_tma_kn_pick_tile(int m);
cudaError_t wgmma_tma_prepare();

// ---- gemm_wgmma_fp8.cu (fp8 weights dequantized in shared memory, the bf16 wgmma chains) ----
int wgmma_fp8_tile_count();
GemmTileInfo wgmma_fp8_tile_info(int tile);
// The tile m rows of an n-feature product in `splits` K slices take (any tile gives the same
// bits).
int wgmma_fp8_pick_tile(int m, int n, int splits);
// cudaErrorNotSupported, launching nothing, when an operand cannot be described to the copy
// engine (gemm_invariant_fp8_runs_wgmma's conditions rule that out).
cudaError_t wgmma_fp8_launch(const TcParams& p, int tile, cudaStream_t stream);
cudaError_t wgmma_fp8_prepare();

// ---- gemm_w8a8.cu (fp8 weights x fp8 activations on the e4m3 tensor cores) ----
int w8a8_tile_count();
GemmTileInfo w8a8_tile_info(int tile);
int w8a8_pick_tile(int m);  // any tile gives the same bits
// cudaErrorNotSupported, launching nothing, when an operand cannot be described to the copy
// engine.
cudaError_t w8a8_launch(const TcParams& p, int tile, cudaStream_t stream);
cudaError_t w8a8_prepare();
int64_t w8a8_scale_ld(int m);  // the scale table's row stride: m rounded up to 8

}  // namespace dsa::cuda
