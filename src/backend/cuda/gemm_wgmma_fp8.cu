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

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_fp8.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

constexpr int kBK = kWgmmaStageK;

template <int kConsumers_, int kN_, int kStages_>
struct Fp8Config {
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kN = kN_;
  static constexpr int kNSub = 1;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kCols = 64 * kConsumers;
  static constexpr int kRows = kN;
  // A stage: the bf16 weight tile [kCols][64] and the x tile [kRows][64], both swizzled, then
  // the fp8 codes [kCols][64] as copied; every part a multiple of 1024 bytes.
  static constexpr int kWBytes = kCols * kSwizzleRowBytes;
  static constexpr int kXBytes = kRows * kSwizzleRowBytes;
  static constexpr int kRawBytes = kCols * kBK;
  static constexpr int kStageBytes = kWBytes + kXBytes + kRawBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + kSwizzleAtomBytes;
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 128, "wgmma.cuh instantiates N = 8 .. 128");
  static_assert(kCols <= 256, "a tensor map box has at most 256 rows");
  static_assert(kConsumers <= 3, "the named barriers 2 .. 4 are the consumers'");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

// A consumer thread's part of the dequantization (thread t of its warpgroup, whose rows of the
// CTA's tile start at wg_row0 = 64 wg): four items of 8 codes, item i being row wg_row0 + t / 8 +
// 16 i, codes [8 (t % 8), 8 (t % 8) + 8) of the stage's 64 k. Their shared-memory offsets within a
// stage (the fp8 codes as copied: rows of 64 bytes; the bf16 tile: 128-byte swizzled rows) are
// the same in every stage, so they are computed once.
template <class C>
struct Fp8Items {
  static constexpr int kItems = 4;
  uint32_t raw[kItems], tile[kItems];

  __device__ __forceinline__ Fp8Items(int wg_row0, int t) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int r = wg_row0 + t / 8 + 16 * i, c = t % 8;
      raw[i] = uint32_t(C::kWBytes + C::kXBytes + r * kBK + 8 * c);
      tile[i] = uint32_t(swizzle128_offset(r, c));
    }
  }
  // Stage `stage` (its shared address): the four items' codes, all loaded before any is
  // converted, as bf16 into the tile. kAllRows: every row of the warpgroup is below n; else
  // rows at or past n (row index within the warpgroup >= rows_left) get +0, as the bf16
  // kernel's zero fill.
  template <bool kAllRows>
  __device__ __forceinline__ void dequantize(uint32_t stage, float scale, int rows_left,
                                             int t) const {
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

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    gemm_wgmma_fp8_kernel(const __grid_constant__ CUtensorMap map_w8,
                          const __grid_constant__ CUtensorMap map_x, TcParams p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ uint64_t full[C::kStages], empty[C::kStages];
  uint8_t* smem = align_to_atom(smem_raw);
  const uint32_t smem_base = smem_addr(smem);

  const WgmmaCta cta = WgmmaCta::of<C>(p);

  init_ring<C>(full, empty, &map_w8, &map_x);

  if (cta.wg == C::kConsumers) {
    if (threadIdx.x % 128 == 0) {  // the producer: the x tile and the fp8 codes of each stage
      for (int kt = 0; kt < cta.tiles; ++kt) {
        const int st = claim_stage<C>(full, empty, kt, uint32_t(C::kXBytes + C::kRawBytes));
        uint8_t* stage = smem + st * C::kStageBytes;
        const int k0 = cta.k_begin + kt * kBK;
        tma_load_3d(stage + C::kWBytes, &map_x, k0, cta.row0, cta.b, &full[st]);
        tma_load_3d(stage + C::kWBytes + C::kXBytes, &map_w8, k0, cta.col0, 0, &full[st]);
      }
    }
  } else {
    const int t = int(threadIdx.x % 128), wg_row0 = 64 * cta.wg;
    const int rows_left = p.n - (cta.col0 + wg_row0);
    const bool all_rows = rows_left >= 64;
    // This warpgroup's 64 rows lie in one 128-row scale block (col0 and wg_row0 are multiples
    // of 64); the stage's 64 k in one 128-wide block.
    const float* scales = p.w8_scale + int64_t((cta.col0 + wg_row0) / 128) * p.ld_w8_scale;
    const Fp8Items<C> items(wg_row0, t);
    const uint32_t barrier = uint32_t(2 + cta.wg);
    wgmma_consume<C>(p, cta, smem_base, empty, [&](int kt, int st, uint32_t parity) {
      const float scale = __ldg(scales + (unsigned(cta.k_begin + kt * kBK) >> 7));
      mbar_wait(&full[st], parity);  // x and the codes landed
      const uint32_t stage = smem_base + uint32_t(st * C::kStageBytes);
      if (all_rows) {
        items.template dequantize<true>(stage, scale, rows_left, t);
      } else {
        items.template dequantize<false>(stage, scale, rows_left, t);
      }
      fence_proxy_async();  // this thread's tile stores, to the tensor cores' reads
      asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
    });
  }
}

template <class C>
cudaError_t launch(const TcParams& p, cudaStream_t stream) {
  // fp8 codes [n][k] of one batch entry: rows past n and k past K read as 0.
  CUtensorMap map_w8, map_x;
  if (p.batch != 1 || !p.vec_w || !encode_x_map<C>(&map_x, p) ||
      !encode_tile_map(&map_w8, TileMap::kBytesPlain, p.w8, p.k, p.n, 1, p.ld_w, 0, kBK,
                       C::kCols)) {
    return cudaErrorNotSupported;
  }
  return launch_on_maps<C>(&wgmma_opt_in<&gemm_wgmma_fp8_kernel<C>, C::kSmemBytes>,
                           &gemm_wgmma_fp8_kernel<C>, map_w8, map_x, p, stream);
}

template <class C>
constexpr GemmTileEntry entry(const char* name) {
  return {{name, C::kRows, C::kCols},
          &launch<C>,
          &wgmma_opt_in<&gemm_wgmma_fp8_kernel<C>, C::kSmemBytes>};
}
// Name: "fp8.", rows of x x output features per CTA, stages; then shared memory per CTA (one CTA
// per SM, 384 or 512 threads).
constexpr GemmTileEntry kTiles[] = {
    entry<Fp8Config<2, 8, 6>>("fp8.8x128.s6"),      // 0: 151 KiB
    entry<Fp8Config<2, 16, 6>>("fp8.16x128.s6"),    // 1: 157 KiB
    entry<Fp8Config<2, 64, 4>>("fp8.64x128.s4"),    // 2: 129 KiB
    entry<Fp8Config<2, 128, 4>>("fp8.128x128.s4"),  // 3: 161 KiB
    entry<Fp8Config<3, 8, 5>>("fp8.8x192.s5"),      // 4: 186 KiB
    entry<Fp8Config<3, 16, 5>>("fp8.16x192.s5"),    // 5: 191 KiB
};

}  // namespace

int wgmma_fp8_tile_count() { return int(std::size(kTiles)); }

GemmTileInfo wgmma_fp8_tile_info(int tile) { return tile_info_in(kTiles, tile); }

int wgmma_fp8_pick_tile(int m, int n, int splits) {
  const int tile = m <= 8 ? 0 : m <= 16 ? 1 : m <= 64 ? 2 : 3;
  // Few rows: the dequantization bounds a CTA, so a grid of 128-feature tiles a little over one
  // wave (gate/up: 144 CTAs on 132 SMs) takes two CTA times; 192-feature tiles fit it in one.
  const int64_t sms = std::max(device_sm_count(), 1);
  const auto ctas = [&](int cols) { return int64_t(ceil_div(n, cols)) * splits; };
  if (tile <= 1 && ctas(128) > sms && ctas(192) <= sms) return tile + 4;
  return tile;
}

cudaError_t wgmma_fp8_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= wgmma_fp8_tile_count() || !p.nk || !p.w8) return cudaErrorInvalidValue;
  return kTiles[tile].launch(p, stream);
}

cudaError_t wgmma_fp8_prepare() { return opt_in_all(kTiles); }

}  // namespace dsa::cuda
