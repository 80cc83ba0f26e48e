// fp8 weights on the wgmma batch-invariant GEMM (opt-in: GemmInvariantTuning::fp8 = 1, or
// DSA_CUDA_GEMM_FP8=wgmma with the wgmma kernel): the bulk-copy pipeline of gemm_wgmma_tma.cu
// with the weight tile copied as fp8 codes and dequantized once per CTA in shared memory.
//
// What it computes: exactly the bits of the bf16 wgmma kernel on the dequantized matrix
// (dsa::dequant_fp8_weight per element). The consumers run WgmmaChains::stage on a bf16 weight
// tile in the 128-byte-swizzled layout of wgmma.cuh. Every element of that tile holds
// bf16(e4m3 * scale) (dequant_fp8x2: the same bits as dequant_fp8_weight) or +0 past n and K. So
// the chains see the operands the bf16 kernel's chains see, in the same places, and the split
// plan and the reduction are the same.
//
// Roles (kConsumers + 1 warpgroups): kConsumers consumer warpgroups (64 features each; two or
// three), and the producer warpgroup, whose first thread issues the copies (the fp8 tile
// [kCols][64 k] as plain bytes, the x tile [kRows][64 k] bf16 swizzled). Each consumer warpgroup
// dequantizes its own 64 rows of a stage into the bf16 tile, then runs its chains on them; its
// wgmma of the stage before runs meanwhile. Per stage s:
//   full[s]  (count 1 + bytes): the copies landed;
//   empty[s] (count kConsumers): the consumers' wgmma of s completed; the producer may refill it.
// A warpgroup writes the rows of stage s's bf16 tile that only its own wgmma reads, after its
// wgmma of the stage's previous use completed (it released empty[s] only then), and fences them
// to the async proxy (fence.proxy.async by every writing thread, then the warpgroup's named
// barrier) before its wgmma of s.
//
// One stage of 64 k lies in one 128-wide scale block along k (slices start on multiples of 128;
// stages on multiples of 64 within them), and a warpgroup's 64 features in one 128-row scale
// block (they start on a multiple of 64): one f32 scale per warpgroup and stage, read from
// global memory.
//
// Runs when gemm_invariant_fp8_runs_wgmma says so (the weights 16-byte aligned with a row stride
// of a multiple of 16 bytes, K a multiple of 8); the backend then hands x over 16-byte aligned.
#include <algorithm>
#include <iterator>
#include <string_view>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_fp8.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

constexpr int kBK = kWgmmaStageK;

// The stage layout both kernels share: kGroups groups of 64 features (kCols), kN rows of x. A
// stage: the bf16 weight tile [kCols][64] and the x tile [kRows][64], both swizzled, then the
// fp8 codes [kCols][64] as copied; every part a multiple of 1024 bytes.
template <int kGroups_, int kN_, int kStages_>
struct Fp8Stages {
  static constexpr int kGroups = kGroups_;
  static constexpr int kN = kN_;
  static constexpr int kNSub = 1;
  static constexpr int kStages = kStages_;
  static constexpr int kCols = 64 * kGroups;
  static constexpr int kRows = kN;
  static constexpr int kWBytes = kCols * kSwizzleRowBytes;
  static constexpr int kXBytes = kRows * kSwizzleRowBytes;
  static constexpr int kRawBytes = kCols * kBK;
  static constexpr int kStageBytes = kWBytes + kXBytes + kRawBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + kSwizzleAtomBytes;
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 128, "wgmma.cuh instantiates N = 8 .. 128");
  static_assert(kCols <= 256, "a tensor map box has at most 256 rows");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

// The consumer kernel's: kConsumers consumer warpgroups (one per group) and the producer's.
template <int kConsumers_, int kN_, int kStages_>
struct Fp8Config : Fp8Stages<kConsumers_, kN_, kStages_> {
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static_assert(kConsumers <= 3, "the named barriers 2 .. 4 are the consumers'");
};

// One thread's part of the dequantization of a group of 64 rows (thread t of the warpgroup that
// converts them; the group's rows of the CTA's tile start at row0, a multiple of 64): four items
// of 8 codes, item i being row row0 + t / 8 + 16 i, codes [8 (t % 8), 8 (t % 8) + 8) of the
// stage's 64 k. Their shared-memory offsets within a stage (the fp8 codes as copied: rows of 64
// bytes; the bf16 tile: 128-byte swizzled rows) are the same in every stage, so they are
// computed once, as are the group's rows below n (rows_left) and its scales: the group's 64 rows
// lie in one 128-row scale block, a stage's 64 k in one 128-wide block.
template <class C>
struct Fp8Rows {
  static constexpr int kItems = 4;
  uint32_t raw[kItems], tile[kItems];
  int t, rows_left;
  const float* scales;

  __device__ __forceinline__ Fp8Rows(const TcParams& p, const WgmmaCta& cta, int row0, int t_)
      : t(t_),
        rows_left(p.n - (cta.col0 + row0)),
        scales(p.w8_scale + int64_t((cta.col0 + row0) / 128) * p.ld_w8_scale) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int r = row0 + t / 8 + 16 * i, c = t % 8;
      raw[i] = uint32_t(C::kWBytes + C::kXBytes + r * kBK + 8 * c);
      tile[i] = uint32_t(swizzle128_offset(r, c));
    }
  }
  // Stage st (tile kt of the CTA, its shared address `stage`): wait for its copies (full),
  // dequantize this thread's items, and fence the stores to the async proxy; the caller then
  // tells the tensor cores' side (a barrier or an arrival).
  __device__ __forceinline__ void convert(uint64_t* full, const WgmmaCta& cta, int kt, int st,
                                          uint32_t parity, uint32_t stage) const {
    const float scale = __ldg(scales + (unsigned(cta.k_begin + kt * kBK) >> 7));
    mbar_wait(&full[st], parity);  // x and the codes landed
    if (rows_left >= 64) {
      dequantize<true>(stage, scale);
    } else {
      dequantize<false>(stage, scale);
    }
    fence_proxy_async();  // this thread's tile stores, to the tensor cores' reads
  }
  // Stage `stage` (its shared address): the four items' codes, all loaded before any is
  // converted, as bf16 into the tile. kAllRows: every row of the warpgroup is below n; else
  // rows at or past n (row index within the warpgroup >= rows_left) get +0, as the bf16
  // kernel's zero fill.
  template <bool kAllRows>
  __device__ __forceinline__ void dequantize(uint32_t stage, float scale) const {
    uint32_t q[kItems][2];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                   : "=r"(q[i][0]), "=r"(q[i][1])
                   : "r"(stage + raw[i]));
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      uint32_t out[4] = {0u, 0u, 0u, 0u};
      if (kAllRows || t / 8 + 16 * i < rows_left) {
        out[0] = dequant_fp8x2(uint16_t(q[i][0] & 0xFFFFu), scale);
        out[1] = dequant_fp8x2(uint16_t(q[i][0] >> 16), scale);
        out[2] = dequant_fp8x2(uint16_t(q[i][1] & 0xFFFFu), scale);
        out[3] = dequant_fp8x2(uint16_t(q[i][1] >> 16), scale);
      }
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(stage + tile[i]), "r"(out[0]),
                   "r"(out[1]), "r"(out[2]), "r"(out[3])
                   : "memory");
    }
  }
};

// The producer's loop (one thread): each stage's x tile and fp8 codes, as the ring frees them.
template <class C>
__device__ __forceinline__ void produce_fp8(uint8_t* smem, uint64_t* full, uint64_t* empty,
                                            const WgmmaCta& cta, const CUtensorMap* map_w8,
                                            const CUtensorMap* map_x) {
  for (int kt = 0; kt < cta.tiles; ++kt) {
    const int st = claim_stage<C>(full, empty, kt, uint32_t(C::kXBytes + C::kRawBytes));
    uint8_t* stage = smem + st * C::kStageBytes;
    const int k0 = cta.k_begin + kt * kBK;
    tma_load_3d(stage + C::kWBytes, map_x, k0, cta.row0, cta.b, &full[st]);
    tma_load_3d(stage + C::kWBytes + C::kXBytes, map_w8, k0, cta.col0, 0, &full[st]);
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    gemm_wgmma_fp8_kernel(const __grid_constant__ CUtensorMap map_w8,
                          const __grid_constant__ CUtensorMap map_x, TcParams p) {
  pdl_enter();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ uint64_t full[C::kStages], empty[C::kStages];
  uint8_t* smem = align_to_atom(smem_raw);
  const uint32_t smem_base = smem_addr(smem);

  const WgmmaCta cta = WgmmaCta::of<C>(p);

  init_ring<C>(full, empty, &map_w8, &map_x);

  if (cta.wg == C::kConsumers) {
    if (threadIdx.x % 128 == 0) produce_fp8<C>(smem, full, empty, cta, &map_w8, &map_x);
  } else {
    const Fp8Rows<C> rows(p, cta, 64 * cta.wg, int(threadIdx.x % 128));
    const uint32_t barrier = uint32_t(2 + cta.wg);
    wgmma_consume<C>(p, cta, smem_base, empty, [&](int kt, int st, uint32_t parity) {
      rows.convert(full, cta, kt, st, parity, smem_base + uint32_t(st * C::kStageBytes));
      asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
    });
  }
}

// The same stages with the roles split (the "fp8r." tiles): a converter warpgroup per group of 64
// features (two or three groups) dequantizes the stage (its group's 64 rows, Fp8Rows as above)
// and signals ready[s] (one arrival per converter warp, after every thread of it fenced its
// stores to the async proxy), while one MMA warpgroup runs the chains of every group (an
// accumulator set each) and alone releases empty[s]. The converters wait on nothing but the
// copies, so they run up to kStages - 1 stages ahead of the tensor cores, and none of their
// instructions is a wgmma, a fence on the accumulators or a barrier. The converters of stage s's
// next use write its bf16 tile after full[s] of that use, which the producer issued after
// empty[s] of this one, which the MMA warpgroup arrives at after the wgmma that read the tile
// completed. Each element's chain is the consumer kernel's, so the bits are too.
template <int kGroups_, int kN_, int kStages_>
struct RolesConfig : Fp8Stages<kGroups_, kN_, kStages_> {
  static constexpr int kConsumers = 1;  // warpgroups that release a stage (the MMA warpgroup)
  static constexpr int kThreads = 128 * (kGroups_ + 2);  // MMA, a converter per group, producer
  static_assert(kN_ * kGroups_ <= 128, "kGroups accumulator sets of kN / 2 registers");
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    gemm_wgmma_fp8_roles_kernel(const __grid_constant__ CUtensorMap map_w8,
                                const __grid_constant__ CUtensorMap map_x, TcParams p) {
  pdl_enter();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ uint64_t full[C::kStages], empty[C::kStages], ready[C::kStages];
  uint8_t* smem = align_to_atom(smem_raw);
  const uint32_t smem_base = smem_addr(smem);

  const WgmmaCta cta = WgmmaCta::of<C>(p);
  if (threadIdx.x == 0) {  // init_ring's fence and barrier publish these too
    for (int st = 0; st < C::kStages; ++st) mbar_init(&ready[st], 4 * C::kGroups);
  }
  init_ring<C>(full, empty, &map_w8, &map_x);

  const int t = int(threadIdx.x % 128);
  if (cta.wg == 1 + C::kGroups) {
    if (t == 0) produce_fp8<C>(smem, full, empty, cta, &map_w8, &map_x);
    return;
  }
  if (cta.wg >= 1) {  // a converter warpgroup: rows [64 g, 64 g + 64) of every stage
    const Fp8Rows<C> rows(p, cta, 64 * (cta.wg - 1), t);
    for (int kt = 0; kt < cta.tiles; ++kt) {
      const int st = kt % C::kStages;
      rows.convert(full, cta, kt, st, uint32_t(kt / C::kStages) & 1u,
                   smem_base + uint32_t(st * C::kStageBytes));
      __syncwarp();
      if (t % 32 == 0) mbar_arrive(&ready[st]);
    }
    return;
  }
  // The MMA warpgroup: per stage, both halves' chains, then the stage before released.
  WgmmaChains<C::kN, 1> chains[C::kGroups];
#pragma unroll
  for (int h = 0; h < C::kGroups; ++h) chains[h].zero();
  for (int kt = 0; kt < cta.tiles; ++kt) {
    const int st = kt % C::kStages;
    const uint32_t parity = uint32_t(kt / C::kStages) & 1u;
    mbar_wait(&full[st], parity);   // x landed
    mbar_wait(&ready[st], parity);  // the weights dequantized
    const uint32_t stage = smem_base + uint32_t(st * C::kStageBytes);
#pragma unroll
    for (int h = 0; h < C::kGroups; ++h) {
      chains[h].stage(stage + uint32_t(h * 64 * kSwizzleRowBytes), stage + uint32_t(C::kWBytes),
                      cta.k_len - kt * kBK);
    }
    wgmma_wait<C::kGroups>();  // stage kt - 1's groups have completed: release it
    if (kt > 0 && t == 0) mbar_arrive(&empty[(kt - 1) % C::kStages]);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < C::kGroups; ++h) {
    chains[h].fence();
    chains[h].store(p, cta.b, cta.s, cta.row0, cta.col0 + 64 * h);
  }
  if (p.splits == 1 || !p.fused) return;
  finish_wgmma_tile<128, 1>(p, cta.b, cta.row0, C::kRows, cta.col0, C::kCols);
}

template <class C, auto kKernel>
cudaError_t launch(const TcParams& p, cudaStream_t stream) {
  // fp8 codes [n][k] of one batch entry: rows past n and k past K read as 0.
  CUtensorMap map_w8, map_x;
  if (p.batch != 1 || !p.vec_w || !encode_x_map<C>(&map_x, p) ||
      !encode_tile_map(&map_w8, TileMap::kBytesPlain, p.w8, p.k, p.n, 1, p.ld_w, 0, kBK,
                       C::kCols)) {
    return cudaErrorNotSupported;
  }
  return launch_on_maps<C>(&wgmma_opt_in<kKernel, C::kSmemBytes>, kKernel, map_w8, map_x, p,
                           stream);
}

template <class C, auto kKernel>
constexpr GemmTileEntry entry_of(const char* name) {
  return {{name, C::kRows, C::kCols}, &launch<C, kKernel>, &wgmma_opt_in<kKernel, C::kSmemBytes>};
}
template <class C>
constexpr GemmTileEntry entry(const char* name) {
  return entry_of<C, &gemm_wgmma_fp8_kernel<C>>(name);
}
template <class C>
constexpr GemmTileEntry roles_entry(const char* name) {
  return entry_of<C, &gemm_wgmma_fp8_roles_kernel<C>>(name);
}
// Name: "fp8." (consumers convert) or "fp8r." (split roles), rows of x x output features per
// CTA, stages; then shared memory per CTA (one CTA per SM, 384 to 640 threads).
constexpr GemmTileEntry kTiles[] = {
    entry<Fp8Config<2, 8, 6>>("fp8.8x128.s6"),             // 0: 151 KiB
    entry<Fp8Config<2, 16, 6>>("fp8.16x128.s6"),           // 1: 157 KiB
    entry<Fp8Config<2, 64, 4>>("fp8.64x128.s4"),           // 2: 129 KiB
    entry<Fp8Config<2, 128, 4>>("fp8.128x128.s4"),         // 3: 161 KiB
    entry<Fp8Config<3, 8, 5>>("fp8.8x192.s5"),             // 4: 186 KiB
    entry<Fp8Config<3, 16, 5>>("fp8.16x192.s5"),           // 5: 191 KiB
    roles_entry<RolesConfig<2, 8, 6>>("fp8r.8x128.s6"),    // 6: 151 KiB
    roles_entry<RolesConfig<2, 16, 6>>("fp8r.16x128.s6"),  // 7: 157 KiB
    roles_entry<RolesConfig<3, 8, 5>>("fp8r.8x192.s5"),    // 8: 186 KiB
    roles_entry<RolesConfig<3, 16, 5>>("fp8r.16x192.s5"),  // 9: 191 KiB
};

// A tile's index by name, at compile time (-1: no such tile; the picks below static_assert it).
constexpr int tile_named(std::string_view name) {
  for (int t = 0; t < int(std::size(kTiles)); ++t) {
    if (name == kTiles[t].info.name) return t;
  }
  return -1;
}
constexpr int kConsumer64 = tile_named("fp8.64x128.s4"),
              kConsumer128 = tile_named("fp8.128x128.s4");
constexpr int kRoles8 = tile_named("fp8r.8x128.s6"), kRoles16 = tile_named("fp8r.16x128.s6");
constexpr int kRoles16Wide = tile_named("fp8r.16x192.s5");
static_assert(kConsumer64 >= 0 && kConsumer128 >= 0 && kRoles8 >= 0 && kRoles16 >= 0 &&
                  kRoles16Wide >= 0,
              "wgmma_fp8_pick_tile names a tile kTiles lacks");

}  // namespace

int wgmma_fp8_tile_count() { return int(std::size(kTiles)); }

GemmTileInfo wgmma_fp8_tile_info(int tile) { return tile_info_in(kTiles, tile); }

int wgmma_fp8_pick_tile(int m, int n, int splits) {
  // By the H200's times of every tile at B = 1 (bench/results/2026-12-04-h200-kn-fp8r.md): up to
  // 16 rows the split roles win (o and down: 0.99-1.02x bf16's time against 1.24-1.26x for the
  // consumer tiles); a grid of 128-feature tiles a little over one wave (gate/up: 144 CTAs on 132
  // SMs, q_b 192) takes two CTA times, so 192-feature tiles fit it in one (fp8r.16x192.s5: gate/up
  // 1.01-1.04x, q_b 0.98x). More rows: the consumer tiles, the only ones there are.
  if (m > 16) return m <= 64 ? kConsumer64 : kConsumer128;
  const int64_t sms = std::max(device_sm_count(), 1);
  const auto ctas = [&](int cols) { return int64_t(ceil_div(n, cols)) * splits; };
  if (ctas(128) > sms && ctas(192) <= sms) return kRoles16Wide;
  return m <= 8 ? kRoles8 : kRoles16;
}

cudaError_t wgmma_fp8_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= wgmma_fp8_tile_count() || !p.nk || !p.w8) return cudaErrorInvalidValue;
  if (p.cluster) return cudaErrorNotSupported;  // its converters take no part in the cluster's
  return kTiles[tile].launch(p, stream);
}

cudaError_t wgmma_fp8_prepare() { return opt_in_all(kTiles); }

}  // namespace dsa::cuda
