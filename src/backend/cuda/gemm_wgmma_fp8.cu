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
// Roles (three warpgroups): kConsumers consumer warpgroups (64 features each), and the producer
// warpgroup, whose first thread issues the copies (the fp8 tile [kCols][64 k] as plain bytes,
// the x tile [kRows][64 k] bf16 swizzled). Each consumer warpgroup dequantizes its own 64 rows of
// a stage into the bf16 tile, then runs its chains on them; its wgmma of the stage before runs
// meanwhile. Per stage s:
//   full[s]  (count 1 + bytes): the copies landed;
//   empty[s] (count kConsumers): the consumers' wgmma of s completed; the producer may refill it.
// A warpgroup writes the rows of stage s's bf16 tile that only its own wgmma reads, after its
// wgmma of the stage's previous use completed (it released empty[s] only then), and fences them
// to the async proxy (fence.proxy.async by every writing thread, then the warpgroup's named
// barrier) before its wgmma of s.
//
// One stage of 64 k lies in one 128-wide scale block along k (slices start on multiples of 128;
// stages on multiples of 64 within them), and the CTA's kCols = 128 features lie in one 128-row
// scale block: one f32 scale per stage, read from global memory.
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
  static_assert(128 % kCols == 0, "a CTA's features lie in one 128-row scale block");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

// This warpgroup's 64 rows (from wg_row0 = 64 wg) of the fp8 codes of a stage (raw: [kCols][64]
// bytes) as bf16 into the swizzled tile w: 8 codes (16 bytes of bf16) per item, four items per
// thread t of the warpgroup, all four loaded before any is converted. Rows at or past n (row
// index within the warpgroup >= rows_left) get +0, as the bf16 kernel's zero fill.
template <class C>
__device__ __forceinline__ void dequantize_rows(uint8_t* w, const uint8_t* raw, int wg_row0,
                                                int rows_left, float scale, int t) {
  constexpr int kChunks = kBK / 8, kItems = 64 * kChunks / 128;
  uint2 q[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int r = wg_row0 + t / kChunks + i * (128 / kChunks), c = t % kChunks;
    q[i] = *reinterpret_cast<const uint2*>(raw + r * kBK + c * 8);
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int r = wg_row0 + t / kChunks + i * (128 / kChunks), c = t % kChunks;
    uint4 out = make_uint4(0, 0, 0, 0);
    if (r - wg_row0 < rows_left) {
      out.x = dequant_fp8x2(uint16_t(q[i].x & 0xFFFFu), scale);
      out.y = dequant_fp8x2(uint16_t(q[i].x >> 16), scale);
      out.z = dequant_fp8x2(uint16_t(q[i].y & 0xFFFFu), scale);
      out.w = dequant_fp8x2(uint16_t(q[i].y >> 16), scale);
    }
    *reinterpret_cast<uint4*>(w + swizzle128_offset(r, c)) = out;
  }
}

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
    const float* scales = p.w8_scale + int64_t(cta.col0 / 128) * p.ld_w8_scale;
    wgmma_consume<C>(p, cta, smem_base, empty, [&](int kt, int st, uint32_t parity) {
      const float scale = __ldg(scales + (cta.k_begin + kt * kBK) / 128);
      mbar_wait(&full[st], parity);  // x and the codes landed
      uint8_t* stage = smem + st * C::kStageBytes;
      dequantize_rows<C>(stage, stage + C::kWBytes + C::kXBytes, wg_row0, rows_left, scale, t);
      fence_proxy_async();  // this thread's tile stores, to the tensor cores' reads
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + cta.wg) : "memory");
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
// per SM, 384 threads each).
constexpr GemmTileEntry kTiles[] = {
    entry<Fp8Config<2, 8, 6>>("fp8.8x128.s6"),      // 0: 151 KiB
    entry<Fp8Config<2, 16, 6>>("fp8.16x128.s6"),    // 1: 157 KiB
    entry<Fp8Config<2, 64, 4>>("fp8.64x128.s4"),    // 2: 129 KiB
    entry<Fp8Config<2, 128, 4>>("fp8.128x128.s4"),  // 3: 161 KiB
};

}  // namespace

int wgmma_fp8_tile_count() { return int(std::size(kTiles)); }

GemmTileInfo wgmma_fp8_tile_info(int tile) { return tile_info_in(kTiles, tile); }

int wgmma_fp8_pick_tile(int m) { return m <= 8 ? 0 : m <= 16 ? 1 : m <= 64 ? 2 : 3; }

cudaError_t wgmma_fp8_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= wgmma_fp8_tile_count() || !p.nk || !p.w8) return cudaErrorInvalidValue;
  return kTiles[tile].launch(p, stream);
}

cudaError_t wgmma_fp8_prepare() { return opt_in_all(kTiles); }

}  // namespace dsa::cuda
