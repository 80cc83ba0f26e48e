// The batch-invariant GEMM on Hopper warpgroup MMA (GemmKernel::kWgmma, kNK weights):
//
//   y_b[m, n] (+)= alpha * sum_k bf16(x_b[m, k]) * w_b[n, k]
//
// the contract of gemm_invariant.cu (x rounded to bf16, f32 tensor-core accumulation, the bound of
// tests/parity/test_parity_gemm), computed with wgmma.mma_async m64nNk16 (wgmma.cuh) instead of
// mma.sync. The two kernels give different bits; each is batch-invariant on its own.
//
// Roles. wgmma's M side is 64 rows of A in shared memory; its N side 8..256 columns of B. The
// weights w [n, k] (k contiguous) are A: one instruction covers 64 output features. The rows of
// x [m, k] (k contiguous) are B: one instruction covers kN rows of the batch (the "batch tile").
// D[i][j] is y[row j][feature i]. Both operands are K-major, so nothing is transposed.
//
// Batch invariance: y[r, f] is a fixed function of row r of x, row f of w, K, N and the batch
// count, never of m or of the other rows:
//   1. K is cut into slices by split_plan (gemm_invariant.cu; from K, N and batch only), exactly as
//      for the mma.sync kernel, and the slices are added in slice order by the same fused or
//      separate reduction (gemm_invariant.cuh, reduce_splits_kernel).
//   2. Within a slice, the warpgroup that owns feature f runs one chain of wgmma over the slice's
//      k16 blocks in ascending order on one accumulator register, starting from +0: exactly
//      ceil(len / 16) instructions, the last one zero-filled past the slice end (+0 products),
//      and no block past it is ever issued. Every instruction of the chain is
//      wgmma.m64nNk16.f32.bf16.bf16 with scale-d = 1: D[i][j] = sum over the 16 k of
//      A[i][k] * B[k][j], added to D[i][j].
//   3. The tile configuration (kTiles: kN, the rows per CTA, the features per CTA, the stages;
//      picked per call, from m among others) decides only which warpgroup and register hold the
//      element, which instruction width N it rides in, and where its x row sits among the
//      instruction's N columns. None of that enters the arithmetic of D[i][j]: the instruction
//      is defined element-wise (the PTX ISA specifies D = A * B + D per element, with no
//      cross-element term), and the tensor core evaluates each element's 16-term dot product
//      and its accumulate in a datapath that sees only row i of A, column j of B and D[i][j];
//      N only sets how many columns are computed side by side. The other columns of B (other
//      rows of the batch, zero fill, garbage) never meet column j. This is the same argument as
//      for mma.sync m16n8k16 (gemm_tensor.cu's header); the parity tests check it bit for bit
//      (ParityGemm: every tile, so every N from 8 to 128, at m = 1 and m = 70, against one
//      another; the probe row alone, among 7, among 255 and at every graph bucket).
// Rows of x at or beyond m are never read (zero-filled in shared memory) and rows of y beyond m
// are never written; features at or beyond n likewise.
//
// Pipeline: every thread of the CTA is a producer (16-byte cp.async.cg into the 128-byte-swizzled
// layout of wgmma.cuh, or element loads with zero fill when a row or the slice end is not
// 16-byte aligned: the same bytes in shared memory either way) and a consumer (one or two
// warpgroups, each 64 features). kStages stages of 64 k each; at iteration kt:
//   wait for tile kt's copies (cp.async.wait_group kStages - 3), fence.proxy.async, barrier;
//   issue the copies of tile kt + kStages - 2 into the stage tile kt - 2 used (its wgmma group
//   completed before every warpgroup's wait at the end of iteration kt - 1, then this barrier);
//   wgmma.fence, the stage's k16 blocks, commit; wgmma.wait_group 1 (tile kt - 1's group done).
// So kStages - 2 tiles of copies are in flight while the tensor cores run the current one.
#include <algorithm>
#include <atomic>
#include <iterator>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

constexpr int kBK = kWgmmaStageK;
constexpr int kChunksPerRow = kBK * 2 / 16;  // 16-byte chunks per row and stage

template <int kWarpgroups_, int kN_, int kNSub_, int kStages_>
struct WgConfig {
  static constexpr int kWarpgroups = kWarpgroups_;  // consumer warpgroups, 64 features each
  static constexpr int kN = kN_;                    // the wgmma N: batch rows per instruction
  static constexpr int kNSub = kNSub_;              // instructions per warpgroup and k16 block
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kCols = 64 * kWarpgroups;  // output features per CTA
  static constexpr int kRows = kN * kNSub;        // rows of x per CTA
  // A stage: the weight tile [kCols][64] then the x tile [kRows][64], both swizzled; every tile
  // and stage a multiple of 1024 bytes, so every swizzle atom stays 1024-aligned.
  static constexpr int kStageBytes = (kCols + kRows) * kSwizzleRowBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + kSwizzleAtomBytes;  // + align slack
  static_assert(kStages >= 3, "one stage in the tensor cores, one landing, one being filled");
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 128, "wgmma.cuh instantiates N = 8 .. 128");
  static_assert(kRows % 8 == 0, "x tiles are whole swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

// Rows [row0, row0 + kTileRows) x k [k0, k0 + 64) of a k-contiguous bf16 matrix into the
// 128-byte-swizzled tile at dst (1024-aligned). Rows >= row_end and k >= k_end become +0 and are
// never read.
template <int kTileRows, int kThreads>
__device__ __forceinline__ void load_swizzled(uint8_t* dst, const uint16_t* src, int64_t ld,
                                              int row0, int row_end, int k0, int k_end, bool vec) {
#pragma unroll 4
  for (int c = threadIdx.x; c < kTileRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, chunk = c % kChunksPerRow;
    const int row = row0 + r, k = k0 + 8 * chunk;
    load_chunk(reinterpret_cast<uint16_t*>(dst + swizzle128_offset(r, chunk)),
               src + int64_t(row) * ld + k, row < row_end, k_end - k, vec);
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1) gemm_wgmma_kernel(TcParams p) {
  pdl_enter();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = align_to_atom(smem_raw);  // the swizzle atoms need 1024-byte alignment
  const uint32_t smem_base = smem_addr(smem);

  const int b = int(blockIdx.z) % p.batch, s = int(blockIdx.z) / p.batch;
  // Row tiles are the fastest grid index: the CTAs that share a weight tile run side by side.
  const int row0 = int(blockIdx.x) * C::kRows, col0 = int(blockIdx.y) * C::kCols;
  const int k_begin = s * p.slice_k;
  const int k_end = min(p.k, k_begin + p.slice_k);
  const int k_len = k_end - k_begin;
  const int tiles = (k_len + kBK - 1) / kBK;
  const uint16_t* x = p.x + int64_t(b) * p.bs_x;
  const uint16_t* w = p.w + int64_t(b) * p.bs_w;

  auto load_stage = [&](int stage, int tile) {
    uint8_t* ws = smem + stage * C::kStageBytes;
    uint8_t* xs = ws + C::kCols * kSwizzleRowBytes;
    const int k0 = k_begin + tile * kBK;
    load_swizzled<C::kCols, C::kThreads>(ws, w, p.ld_w, col0, p.n, k0, k_end, p.vec_w);
    load_swizzled<C::kRows, C::kThreads>(xs, x, p.ld_x, row0, p.m, k0, k_end, p.vec_x);
  };

  const int wg = int(threadIdx.x) / 128;
  WgmmaChains<C::kN, C::kNSub> chains;
  chains.zero();

  // Commit group i carries tile i (empty groups past the last tile keep the count regular).
#pragma unroll
  for (int st = 0; st < C::kStages - 2; ++st) {
    if (st < tiles) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<C::kStages - 3>();  // groups 0..kt have landed (for this thread)
    fence_proxy_async();              // ... and are visible to the tensor cores' reads
    __syncthreads();                  // ... for every thread; tile kt - 2's wgmma are done
    const int next = kt + C::kStages - 2;
    if (next < tiles) load_stage(next % C::kStages, next);
    cp_async_commit();

    const uint32_t stage = smem_base + uint32_t((kt % C::kStages) * C::kStageBytes);
    chains.stage(stage + uint32_t(wg * 64 * kSwizzleRowBytes),
                 stage + uint32_t(C::kCols * kSwizzleRowBytes), k_len - kt * kBK);
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  chains.fence();
  cp_async_wait<0>();  // nothing is in flight past here (the trailing groups are empty)
  chains.store(p, b, s, row0, col0 + wg * 64);
  if (p.splits == 1 || !p.fused) return;
  finish_wgmma_tile<C::kThreads>(p, b, row0, C::kRows, col0, C::kCols);
}

template <class C>
cudaError_t opt_in(bool force) {
  return wgmma_opt_in<&gemm_wgmma_kernel<C>, C::kSmemBytes>(force);
}

template <class C>
cudaError_t launch(const TcParams& p, cudaStream_t stream) {
  const cudaError_t err = opt_in<C>(false);
  if (err != cudaSuccess) return err;
  launch_kernel(gemm_wgmma_kernel<C>, wgmma_grid<C>(p), C::kThreads, C::kSmemBytes, stream, p);
  return cudaGetLastError();
}

using TileEntry = GemmTileEntry;
template <class C>
constexpr TileEntry entry(const char* name) {
  return {{name, C::kRows, C::kCols}, &launch<C>, &opt_in<C>};
}
// The tile configurations, by index (GemmInvariantTuning::tile names them by it when the kernel
// is kWgmma). Every one runs the same chains (header comment, 3.), so the choice is free per call.
// Name: rows of x x output features per CTA, stages; then threads and shared memory per CTA.
constexpr TileEntry kTiles[] = {
    entry<WgConfig<1, 8, 1, 8>>("8x64.s8"),       // 0: 128, 73 KiB
    entry<WgConfig<1, 16, 1, 8>>("16x64.s8"),     // 1: 128, 81 KiB
    entry<WgConfig<1, 32, 1, 6>>("32x64.s6"),     // 2: 128, 73 KiB
    entry<WgConfig<1, 64, 1, 6>>("64x64.s6"),     // 3: 128, 97 KiB
    entry<WgConfig<2, 64, 1, 4>>("64x128.s4"),    // 4: 256, 97 KiB
    entry<WgConfig<1, 128, 1, 4>>("128x64.s4"),   // 5: 128, 97 KiB
    entry<WgConfig<2, 128, 1, 4>>("128x128.s4"),  // 6: 256, 129 KiB
    entry<WgConfig<1, 128, 2, 4>>("256x64.s4"),   // 7: 128, 161 KiB
    entry<WgConfig<2, 128, 2, 4>>("256x128.s4"),  // 8: 256, 193 KiB
    entry<WgConfig<2, 8, 1, 6>>("8x128.s6"),      // 9: 256, 103 KiB
    entry<WgConfig<1, 8, 1, 12>>("8x64.s12"),     // 10: 128, 109 KiB
    entry<WgConfig<2, 16, 1, 6>>("16x128.s6"),    // 11: 256, 109 KiB
    entry<WgConfig<2, 32, 1, 6>>("32x128.s6"),    // 12: 256, 121 KiB
};
constexpr int kTileCount = int(std::size(kTiles));
// Tiles kTileCount + i are gemm_wgmma_tma.cu's tile i (the same chains, fed by the bulk copy
// engine); each has a cp.async tile of its rows x cols above, which runs when the copy engine
// cannot take the operands.
constexpr int tma(int i) { return kTileCount + i; }

// Candidates per class of m, preferred first: the first whose grid fills the SMs with at least
// kMinWaveUse of its last wave wins, else the one with the most CTAs.
constexpr double kMinWaveUse = 0.7;
// Narrow shapes (few output features, split K) fall back to smaller tiles for more CTAs.
struct Candidates {
  int max_m;
  int tiles[6];
};
constexpr Candidates kCandidates[] = {
    {8, {tma(0), tma(1), -1, -1, -1, -1}},
    {16, {tma(2), tma(1), -1, -1, -1, -1}},
    {32, {tma(3), tma(2), tma(1), -1, -1, -1}},
    {64, {tma(4), tma(5), tma(3), tma(2), tma(1), -1}},
    {128, {tma(6), tma(7), tma(4), tma(5), tma(3), -1}},
    {1 << 30, {tma(8), tma(6), tma(7), tma(4), tma(5), -1}},
};

// The cp.async tile with the rows and columns of TMA tile `tile` (0 when none: never, by the
// table's construction; the fallback only has to give the same bits, which any tile does).
int fallback_of(int tile) {
  const GemmTileInfo want = wgmma_tma_tile_info(tile - kTileCount);
  for (int t = 0; t < kTileCount; ++t) {
    if (kTiles[t].info.rows == want.rows && kTiles[t].info.cols == want.cols) return t;
  }
  return 0;
}

std::atomic<uint64_t> g_bulk_copy_fallbacks{0};

}  // namespace

uint64_t wgmma_bulk_copy_fallbacks() { return g_bulk_copy_fallbacks.load(); }

int wgmma_tile_count() { return kTileCount + wgmma_tma_tile_count(); }
GemmTileInfo wgmma_tile_info(int tile) {
  if (tile >= kTileCount && tile < wgmma_tile_count())
    return wgmma_tma_tile_info(tile - kTileCount);
  return tile >= 0 && tile < kTileCount ? kTiles[tile].info : GemmTileInfo{"default", 0, 0};
}

int wgmma_pick_tile(int m, int n, int batch, int splits) {
  const int64_t sms = std::max(device_sm_count(), 1);
  for (const Candidates& c : kCandidates) {
    if (m > c.max_m) continue;
    int most = c.tiles[0];
    int64_t most_ctas = 0;
    for (int t : c.tiles) {
      if (t < 0) break;
      const GemmTileInfo info = wgmma_tile_info(t);
      const int64_t ctas =
          int64_t(ceil_div(m, info.rows)) * ceil_div(n, info.cols) * batch * splits;
      const int64_t waves = (ctas + sms - 1) / sms;
      if (ctas >= sms && double(ctas) >= kMinWaveUse * double(waves * sms)) return t;
      if (ctas > most_ctas) most = t, most_ctas = ctas;
    }
    return most;
  }
  return 0;
}

cudaError_t wgmma_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= wgmma_tile_count() || !p.nk) return cudaErrorInvalidValue;
  if (tile >= kTileCount) {
    const cudaError_t err = wgmma_tma_launch(p, tile - kTileCount, stream);
    if (err != cudaErrorNotSupported || p.cluster) return err;
    g_bulk_copy_fallbacks.fetch_add(1, std::memory_order_relaxed);
    tile = fallback_of(tile);
  }
  // The cp.async tiles reduce through partial only: the caller runs them without the cluster.
  if (p.cluster) return cudaErrorNotSupported;
  return kTiles[tile].launch(p, stream);
}

bool wgmma_tile_is_bulk_copy(int tile) { return tile >= kTileCount && tile < wgmma_tile_count(); }

cudaError_t wgmma_prepare() {
  if (const cudaError_t err = opt_in_all(kTiles); err != cudaSuccess) return err;
  return wgmma_tma_prepare();
}

}  // namespace dsa::cuda
