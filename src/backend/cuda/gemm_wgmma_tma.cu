// The wgmma batch-invariant GEMM with a warp-specialized bulk-copy pipeline: the same chains as
// gemm_wgmma.cu (its header: the roles, the split plan, one chain of wgmma.m64nNk16 per element
// from +0 over the slice's k16 blocks in ascending order, the last stage issuing only the k16
// blocks below the slice end), so every tile here gives the bits of every tile there; only the
// way the tiles reach shared memory differs.
//
// Roles. One producer warpgroup, whose first thread issues the bulk tensor copies (tma.cuh) of
// the weight tile [kCols features][64 k] and the x tile [kRows rows][64 k] of each k stage into
// a ring of kStages stages, each completing on its stage's `full` barrier; the copy engine writes
// the 128-byte-swizzled layout of wgmma.cuh and fills with +0 everything past n (weights), past
// m (x rows: never read) and past K. kConsumers warpgroups, 64 features each, wait on `full`,
// issue the stage's wgmma, and release the stage on its `empty` barrier once the group that read
// it has completed (wgmma.wait_group 1 one stage later). Neither side waits on a CTA-wide
// barrier in the main loop, so the copies of the next kStages - 1 stages are in flight while the
// tensor cores run, and no thread of a consumer spends an instruction on loads.
//
// A slice never straddles a copy: slices start on multiples of 128 (gemm_invariant.cu), stages on
// multiples of 64 within them, and only the last slice ends short of a stage, at K, where the
// copy engine's zero fill stands in for gemm_wgmma.cu's. The consumers issue the k16 blocks below
// the slice end only, as there, so the zero fill is never multiplied.
//
// Pairs (the .mc2 tiles, kPair = 2). The two CTAs of a cluster along the features (grid y) work
// on the same rows of x and the same k stages, and each needs the stage's whole x tile; from L2
// into shared memory that tile is most of a large tile's traffic (the 256 x 128 tile's stage is
// 16 KiB of weights and 32 KiB of x). So each CTA's copy brings half the x rows, multicast into
// both CTAs at the same offset, and each CTA's `full` barrier expects its own weight tile and the
// whole x tile. A stage is written by both CTAs, so its `empty` barrier counts the consumer
// warpgroups of both (each consumer arrives in its own CTA and, remotely, in the other's), the
// ring starts after a cluster barrier (both CTAs' barriers are initialized) and ends with one (no
// remote arrival reaches a CTA that has left). With an odd count of feature tiles the last pair's
// second CTA lies past n: its weight box reads as +0 and it stores nothing, but it brings its half
// of x. The chains and their order are those of kPair = 1: the same bits. A pair's slices reduce
// in the separate kernel: where the call asks for the cluster reduction or the fused one, the
// tile runs unpaired (TmaConfig::Unpaired, the same tile without the multicast).
//
// Needs 16-byte-aligned bases and row and batch strides that are multiples of 8 elements (what
// the tensor map encoder accepts); gemm_wgmma.cu falls back to its cp.async tile of the same
// shape otherwise (wgmma_tma_launch returns cudaErrorNotSupported and launches nothing).
#include <algorithm>
#include <atomic>
#include <iterator>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

constexpr int kBK = kWgmmaStageK;

template <int kConsumers_, int kN_, int kNSub_, int kStages_, int kMinBlocks_, int kPair_ = 1>
struct TmaConfig {
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups, 64 features each
  static constexpr int kN = kN_;                  // the wgmma N: batch rows per instruction
  static constexpr int kNSub = kNSub_;            // instructions per warpgroup and k16 block
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the registers are capped for
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kCols = 64 * kConsumers;    // output features per CTA
  static constexpr int kRows = kN * kNSub;         // rows of x per CTA
  static constexpr int kPair = kPair_;             // CTAs sharing each x tile (the header)
  static constexpr int kXBoxRows = kRows / kPair;  // rows of x each CTA's copy brings
  using Unpaired = TmaConfig<kConsumers_, kN_, kNSub_, kStages_, kMinBlocks_, 1>;
  static constexpr int kWBytes = kCols * kSwizzleRowBytes;
  static constexpr int kStageBytes = (kCols + kRows) * kSwizzleRowBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + kSwizzleAtomBytes;  // + align slack
  // setmaxnreg needs the entry cap of one CTA per SM; a consumer then holds up to 232 registers.
  static constexpr bool kRebalance = kMinBlocks == 1;
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 128, "wgmma.cuh instantiates N = 8 .. 128");
  static_assert(kRows <= 256 && kCols <= 256, "a tensor map box has at most 256 rows");
  static_assert(kStages >= 2, "one stage in the tensor cores, one landing");
  static_assert(kPair == 1 || (kPair == 2 && kXBoxRows % 8 == 0),
                "a pair's halves of x start on a swizzle atom");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

// kKn: the weights are kKN ([batch][k][n]): each consumer warpgroup's 64 features come as one
// box of [64 k rows][64 features], MN-major (WgmmaChains' kMnA), at the offset its K-major tile
// would have.
template <class C, bool kKn>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    gemm_wgmma_tma_kernel(const __grid_constant__ CUtensorMap map_w,
                          const __grid_constant__ CUtensorMap map_x, TcParams p) {
  pdl_launch_dependents();  // the waits: the producer's in produce_stages, the consumers' below
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ uint64_t full[C::kStages], empty[C::kStages];
  uint8_t* smem = align_to_atom(smem_raw);  // the swizzle atoms need 1024-byte alignment
  const uint32_t smem_base = smem_addr(smem);

  const WgmmaCta cta = WgmmaCta::of<C>(p);

  init_ring<C>(full, empty, &map_w, &map_x);
  // A pair: the other CTA's barriers are initialized before any copy or arrival reaches them.
  if constexpr (C::kPair > 1) cluster_sync();

  if (cta.wg == C::kConsumers) {
    // The producer warpgroup: one thread issues every copy.
    if constexpr (C::kRebalance) warpgroup_reg_dealloc<40>();
    if (threadIdx.x % 128 == 0) {
      auto load_w = [&](int kt, int st) {
        uint8_t* ws = smem + st * C::kStageBytes;
        const int k0 = cta.k_begin + kt * kBK;
        if constexpr (kKn) {
#pragma unroll
          for (int g = 0; g < C::kConsumers; ++g) {
            tma_load_3d(ws + g * 64 * kSwizzleRowBytes, &map_w, cta.col0 + 64 * g, k0, cta.b,
                        &full[st]);
          }
        } else {
          tma_load_3d(ws, &map_w, k0, cta.col0, cta.b, &full[st]);
        }
      };
      // A pair: this CTA's half of the x rows (its rank in the cluster).
      const int half = C::kPair > 1 ? int(cooperative_groups::this_cluster().block_rank()) : 0;
      auto load_x = [&](int kt, int st) {
        uint8_t* xs = smem + st * C::kStageBytes + C::kWBytes;
        const int k0 = cta.k_begin + kt * kBK;
        if constexpr (C::kPair > 1) {
          tma_load_3d_multicast(xs + half * C::kXBoxRows * kSwizzleRowBytes, &map_x, k0,
                                cta.row0 + half * C::kXBoxRows, cta.b, &full[st],
                                uint16_t((1u << C::kPair) - 1u));
        } else {
          tma_load_3d(xs, &map_x, k0, cta.row0, cta.b, &full[st]);
        }
      };
      produce_stages<C>(p, full, empty, cta.tiles, uint32_t(C::kStageBytes), load_w, load_x);
    }
    if (p.cluster) cluster_tile_bystander();
  } else {
    if constexpr (C::kRebalance) warpgroup_reg_alloc<232>();
    pdl_wait();  // before any access to global memory
    wgmma_consume<C, kKn>(p, cta, smem_base, empty,
                          [&](int, int st, uint32_t parity) { mbar_wait(&full[st], parity); });
  }
  if constexpr (C::kPair > 1) {
    __syncwarp();
    cluster_sync();  // the other CTA's last remote arrivals on this one's barriers are in
  }
}

template <class C, bool kKn>
cudaError_t launch(const TcParams& p, cudaStream_t stream) {
  if constexpr (C::kPair > 1) {
    if (p.cluster || p.fused) return launch<typename C::Unpaired, kKn>(p, stream);  // the header
  }
  // Weights [batch][n][k] (kKN: [batch][k][n]): rows past n and k past K read as +0.
  CUtensorMap map_w, map_x;
  const bool mapped =
      p.vec_w &&
      (kKn ? encode_tile_map(&map_w, TileMap::kBf16Swizzle128, p.w, p.n, p.k, p.batch, p.ld_w,
                             p.bs_w, 64, kBK)
           : encode_tile_map(&map_w, TileMap::kBf16Swizzle128, p.w, p.k, p.n, p.batch, p.ld_w,
                             p.bs_w, kBK, C::kCols)) &&
      (C::kPair > 1 ? p.vec_x && encode_tile_map(&map_x, TileMap::kBf16Swizzle128, p.x, p.k, p.m,
                                                 p.batch, p.ld_x, p.bs_x, kBK, C::kXBoxRows)
                    : encode_x_map<C>(&map_x, p));
  if (!mapped) return cudaErrorNotSupported;
  return launch_on_maps<C>(&wgmma_opt_in<&gemm_wgmma_tma_kernel<C, kKn>, C::kSmemBytes>,
                           &gemm_wgmma_tma_kernel<C, kKn>, map_w, map_x, p, stream);
}

template <class C, bool kKn = false>
constexpr GemmTileEntry entry(const char* name) {
  return {{name, C::kRows, C::kCols, C::kPair},
          &launch<C, kKn>,
          &wgmma_opt_in<&gemm_wgmma_tma_kernel<C, kKn>, C::kSmemBytes>};
}
// Name: "tma.", rows of x x output features per CTA, stages; then threads, shared memory per CTA
// and the CTAs per SM that fit. gemm_wgmma.cu keeps a cp.async tile of each rows x cols.
constexpr GemmTileEntry kTiles[] = {
    entry<TmaConfig<2, 8, 1, 6, 2>>("tma.8x128.s6"),      // 0: 384, 103 KiB, 2
    entry<TmaConfig<1, 8, 1, 8, 3>>("tma.8x64.s8"),       // 1: 256, 73 KiB, 3
    entry<TmaConfig<2, 16, 1, 6, 2>>("tma.16x128.s6"),    // 2: 384, 109 KiB, 2
    entry<TmaConfig<2, 32, 1, 5, 2>>("tma.32x128.s5"),    // 3: 384, 101 KiB, 2
    entry<TmaConfig<2, 64, 1, 4, 2>>("tma.64x128.s4"),    // 4: 384, 97 KiB, 2
    entry<TmaConfig<1, 64, 1, 6, 2>>("tma.64x64.s6"),     // 5: 256, 97 KiB, 2
    entry<TmaConfig<2, 128, 1, 5, 1>>("tma.128x128.s5"),  // 6: 384, 161 KiB, 1
    entry<TmaConfig<1, 128, 1, 6, 1>>("tma.128x64.s6"),   // 7: 256, 145 KiB, 1
    entry<TmaConfig<2, 128, 2, 4, 1>>("tma.256x128.s4"),  // 8: 384, 193 KiB, 1
    // Pairs sharing x (the header), opt-in: the sweep and DSA_CUDA_GEMM tuning reach them.
    entry<TmaConfig<2, 128, 2, 4, 1, 2>>("tma.256x128.s4.mc2"),  // 9: 384, 193 KiB, 1
    entry<TmaConfig<2, 128, 1, 5, 1, 2>>("tma.128x128.s5.mc2"),  // 10: 384, 161 KiB, 1
    entry<TmaConfig<2, 64, 1, 4, 2, 2>>("tma.64x128.s4.mc2"),    // 11: 384, 97 KiB, 2
};
// The same tiles for kKN weights (opt-in: GemmInvariantTuning::kn), by the same index.
constexpr GemmTileEntry kTilesKn[] = {
    entry<TmaConfig<2, 8, 1, 6, 2>, true>("tma.8x128.s6"),
    entry<TmaConfig<1, 8, 1, 8, 3>, true>("tma.8x64.s8"),
    entry<TmaConfig<2, 16, 1, 6, 2>, true>("tma.16x128.s6"),
    entry<TmaConfig<2, 32, 1, 5, 2>, true>("tma.32x128.s5"),
    entry<TmaConfig<2, 64, 1, 4, 2>, true>("tma.64x128.s4"),
    entry<TmaConfig<1, 64, 1, 6, 2>, true>("tma.64x64.s6"),
    entry<TmaConfig<2, 128, 1, 5, 1>, true>("tma.128x128.s5"),
    entry<TmaConfig<1, 128, 1, 6, 1>, true>("tma.128x64.s6"),
    entry<TmaConfig<2, 128, 2, 4, 1>, true>("tma.256x128.s4"),
    entry<TmaConfig<2, 128, 2, 4, 1, 2>, true>("tma.256x128.s4.mc2"),
    entry<TmaConfig<2, 128, 1, 5, 1, 2>, true>("tma.128x128.s5.mc2"),
    entry<TmaConfig<2, 64, 1, 4, 2, 2>, true>("tma.64x128.s4.mc2"),
};
static_assert(std::size(kTilesKn) == std::size(kTiles), "one kKN tile per tile");

}  // namespace

int wgmma_tma_tile_count() { return int(std::size(kTiles)); }

GemmTileInfo wgmma_tma_tile_info(int tile) { return tile_info_in(kTiles, tile); }

cudaError_t wgmma_tma_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= wgmma_tma_tile_count()) return cudaErrorInvalidValue;
  return (p.nk ? kTiles : kTilesKn)[tile].launch(p, stream);
}

int wgmma_tma_kn_pick_tile(int m) {
  // The first 128-feature tile of at most 128 rows (kTiles lists them by rows) that holds m rows,
  // else the largest.
  int pick = -1;
  for (int t = 0; t < wgmma_tma_tile_count(); ++t) {
    const GemmTileInfo info = wgmma_tma_tile_info(t);
    if (info.cols != 128 || info.rows > 128 || info.pair != 1) continue;  // pairs: opt-in
    pick = t;
    if (info.rows >= m) break;
  }
  return pick;
}

cudaError_t wgmma_tma_prepare() {
  if (const cudaError_t err = opt_in_all(kTiles); err != cudaSuccess) return err;
  return opt_in_all(kTilesKn);
}

}  // namespace dsa::cuda
