// fp8 weights times fp8 activations (GemmParams::x_fp8, `--weights w8a8`): DeepSeek's inference
// numerics on the e4m3 tensor cores, with nothing dequantized. Two kernels:
//
// quantize_x_fp8_kernel: x (f32 [m, k]) to e4m3 codes [m, k] (row stride out.ld bytes) and one
// scale per row and 128-wide k block, stored transposed, [k blocks][out.ld_scales] (zero_pad: rows
// past m, up to m rounded to 8, get 0): one warp per (row, block), the group encoder of the
// indexer's query (query_fp8.cuh: encode_fp8_group's bytes and scale exactly, the 128 values of
// a block; past k the values are 0, which leaves the amax and the codes below k unchanged).
//
// gemm_w8a8_kernel: the bulk-copy pipeline of gemm_wgmma_tma.cu with stages of one 128-wide k
// block (one scale block): the copy engine brings the weight codes [kCols][128 bytes] and the x
// codes [kRows][128 bytes] of each stage 128-byte swizzled (the e4m3 operands' K-major layout is
// the bf16 one byte for byte: a row of 128 codes is one swizzle row, a k32 step 32 bytes into
// it). Per stage and element, the block product
//   P = chain of four wgmma.m64nNk32.f32.e4m3.e4m3 over the block's k32 steps in ascending order,
//       from +0 (the tensor core's own accumulation of exact products)
// is added into the element's f32 accumulator as acc = fma(P, s_x * s_w, acc), blocks in
// ascending order; the slices of split_plan and their reduction are gemm_invariant.cu's. Each
// element's value is thus a function of its x row, its weight row, K and the plan alone: the
// tile (rows of x per CTA) never changes a bit, so the GEMM is batch-invariant like the others.
// Past K, n and m the copy engine fills +0 codes, whose products add nothing; P of a short last
// block therefore equals the chain over its k32 steps below K.
//
// Two block products are in flight per warpgroup (P0, P1 alternate): stage kt's chain is issued,
// then stage kt - 1's completes (wgmma.wait_group 1), is scaled into acc, and its stage goes back
// to the producer, so the tensor cores never wait on the promotion.
#include <algorithm>
#include <atomic>
#include <iterator>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/query_fp8.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

constexpr int kBlockK = 128;  // k per stage: one scale block, one 128-byte row of codes

template <int kConsumers_, int kN_, int kStages_>
struct W8a8Config {
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups, 64 features each
  static constexpr int kN = kN_;                  // the wgmma N: rows of x per CTA
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kCols = 64 * kConsumers;
  static constexpr int kRows = kN;
  static constexpr int kWBytes = kCols * kBlockK;
  static constexpr int kStageBytes = (kCols + kRows) * kBlockK;
  static constexpr int kSmemBytes = kStages * kStageBytes + kSwizzleAtomBytes;
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 64, "wgmma_e4m3 instantiates N = 8 .. 64");
  static_assert(kStages >= 2, "one stage in the tensor cores, one landing");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

// One warpgroup's accumulators and block products, and its share of the scales: thread t holds
// D rows (features) 16 warp + g (+ 8) and columns (rows of x) 8 j + 2 q (+ 1), j < kN / 8.
template <int kN>
struct W8a8Acc {
  static constexpr int kRegs = kN / 2, kPairs = kN / 8;
  float acc[kRegs];

  // The four k32 steps of the stage at a_tile (this warpgroup's 64 weight rows) and b_tile (x),
  // into p from +0, committed as one group.
  __device__ __forceinline__ static void issue(float (&p)[kRegs], uint32_t a_tile,
                                               uint32_t b_tile) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) fence_operand(p[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 32; ++kk) {
      wgmma_e4m3<kN>(p, wgmma_desc_sw128(a_tile + 32 * kk), wgmma_desc_sw128(b_tile + 32 * kk),
                     kk > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < kRegs; ++i) fence_operand(p[i]);
  }
  // acc += p * (s_x * s_w) per element, p's group having completed; s holds s_x of this
  // thread's x rows (pair j: rows 8 j + 2 q, + 1) and s_w.
  __device__ __forceinline__ void promote(float (&p)[kRegs], const float2 (&sx)[kPairs], float sw) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) fence_operand(p[i]);
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const float2 s = sx[i / 4];
      acc[i] = __fmaf_rn(p[i], __fmul_rn(i % 2 ? s.y : s.x, sw), acc[i]);
    }
  }
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    gemm_w8a8_kernel(const __grid_constant__ CUtensorMap map_w8,
                     const __grid_constant__ CUtensorMap map_x8, TcParams p) {
  pdl_launch_dependents();  // the waits: the producer's in produce_stages, the consumers' below
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ uint64_t full[C::kStages], empty[C::kStages];
  uint8_t* smem = align_to_atom(smem_raw);
  const uint32_t smem_base = smem_addr(smem);

  const WgmmaCta cta = WgmmaCta::of<C>(p);
  const int stages = (cta.k_len + kBlockK - 1) / kBlockK;
  const int kb0 = cta.k_begin / kBlockK;  // slices start on scale blocks

  init_ring<C>(full, empty, &map_w8, &map_x8);

  if (cta.wg == C::kConsumers) {  // the producer warpgroup: one thread issues every copy
    if (threadIdx.x % 128 == 0) {
      produce_stages<C>(
          p, full, empty, stages, uint32_t(C::kStageBytes),
          [&](int kt, int st) {
            tma_load_3d(smem + st * C::kStageBytes, &map_w8, cta.k_begin + kt * kBlockK, cta.col0,
                        0, &full[st]);
          },
          [&](int kt, int st) {
            tma_load_3d(smem + st * C::kStageBytes + C::kWBytes, &map_x8,
                        cta.k_begin + kt * kBlockK, cta.row0, 0, &full[st]);
          });
    }
    if (p.cluster) cluster_tile_bystander();
    return;
  }
  pdl_wait();  // the consumers, before any access to global memory

  constexpr int kN = C::kN;
  using Acc = W8a8Acc<kN>;
  const int t = int(threadIdx.x % 128), q = t % 4;
  const int col_wg = cta.col0 + 64 * cta.wg;  // this warpgroup's first feature
  // Its 64 features lie in one 128-row scale block (col_wg is a multiple of 64).
  const float* sw_row = p.w8_scale + int64_t(col_wg / kGemmFp8Block) * p.ld_w8_scale;
  const bool features = col_wg < p.n;
  // s_x of stage kt for this thread's x rows: pairs of adjacent rows from the transposed table
  // (rows past m hold 0 up to ld_x8_scale; past it, 0 here).
  auto scales = [&](int kt, float2(&sx)[Acc::kPairs], float& sw) {
    const float* col = p.x8_scale + int64_t(kb0 + kt) * p.ld_x8_scale;
#pragma unroll
    for (int j = 0; j < Acc::kPairs; ++j) {
      const int row = cta.row0 + 8 * j + 2 * q;
      sx[j] = row < p.ld_x8_scale ? __ldg(reinterpret_cast<const float2*>(col + row))
                                  : make_float2(0.0f, 0.0f);
    }
    sw = features ? __ldg(sw_row + kb0 + kt) : 0.0f;
  };
  const uint32_t a_off = uint32_t(cta.wg * 64 * kBlockK), b_off = uint32_t(C::kWBytes);
  auto wait_issue = [&](int kt, float(&part)[Acc::kRegs]) {
    const int st = kt % C::kStages;
    mbar_wait(&full[st], uint32_t(kt / C::kStages) & 1u);
    const uint32_t stage = smem_base + uint32_t(st * C::kStageBytes);
    Acc::issue(part, stage + a_off, stage + b_off);
  };
  const bool leader = t == 0;
  auto release = [&](int kt) {
    if (leader) mbar_arrive(&empty[kt % C::kStages]);
  };

  Acc a;
#pragma unroll
  for (int i = 0; i < Acc::kRegs; ++i) a.acc[i] = 0.0f;
  float part0[Acc::kRegs], part1[Acc::kRegs];
  float2 sx0[Acc::kPairs], sx1[Acc::kPairs];
  float sw0, sw1;
  // Stage s's product goes to part(s % 2); stage kt - 1's is promoted once stage kt's is issued.
  wait_issue(0, part0);
  scales(0, sx0, sw0);
  int kt = 1;
  for (; kt + 1 < stages; kt += 2) {
    wait_issue(kt, part1);
    scales(kt, sx1, sw1);
    wgmma_wait<1>();
    a.promote(part0, sx0, sw0);
    release(kt - 1);
    wait_issue(kt + 1, part0);
    scales(kt + 1, sx0, sw0);
    wgmma_wait<1>();
    a.promote(part1, sx1, sw1);
    release(kt);
  }
  if (kt < stages) {
    wait_issue(kt, part1);
    scales(kt, sx1, sw1);
    wgmma_wait<1>();
    a.promote(part0, sx0, sw0);
    wgmma_wait<0>();
    a.promote(part1, sx1, sw1);
  } else {
    wgmma_wait<0>();
    a.promote(part0, sx0, sw0);
  }

  // The store (D fragment: feature 16 warp + g (+ 8), x row 8 j + 2 q (+ 1)), then the fused
  // split reduction among the consumers (named barrier 1: the producer warpgroup has left).
  // f(r, c, value) per chain: r its x row among the CTA's, c its feature among the CTA's.
  const int warp = t / 32, g = (t % 32) / 4;
  auto each = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < Acc::kRegs; ++i) {
      const int j = i / 4, e = i % 4;
      f(8 * j + 2 * q + e % 2, 64 * cta.wg + 16 * warp + g + 8 * (e / 2), a.acc[i]);
    }
  };
  if (p.cluster) {  // the cluster reduction (gemm_wgmma.cuh), the tile over the freed stages
    reduce_chains_in_cluster<C>(p, cta.row0, cta.col0, smem, [&](float* tile, int pitch) {
      each([&](int r, int c, float v) { tile[r * pitch + c] = v; });
    });
    return;
  }
  each([&](int r, int c, float v) {
    const int row = cta.row0 + r, col = cta.col0 + c;
    if (row < p.m && col < p.n) store_chain(p, cta.b, cta.s, row, col, v);
  });
  if (p.splits == 1 || !p.fused) return;
  finish_wgmma_tile<128 * C::kConsumers, 1>(p, cta.b, cta.row0, C::kRows, cta.col0, C::kCols);
}

template <class C>
cudaError_t launch(const TcParams& p, cudaStream_t stream) {
  // Codes [n][k] and [m][k]: rows past n or m and k past K read as +0.
  CUtensorMap map_w8, map_x8;
  if (p.batch != 1 || !p.vec_w ||
      !encode_tile_map(&map_w8, TileMap::kBytesSwizzle128, p.w8, p.k, p.n, 1, p.ld_w, 0, kBlockK,
                       C::kCols) ||
      !encode_tile_map(&map_x8, TileMap::kBytesSwizzle128, p.x8, p.k, p.m, 1, p.ld_x8, 0, kBlockK,
                       C::kRows)) {
    return cudaErrorNotSupported;
  }
  return launch_on_maps<C>(&wgmma_opt_in<&gemm_w8a8_kernel<C>, C::kSmemBytes>, &gemm_w8a8_kernel<C>,
                           map_w8, map_x8, p, stream);
}

template <class C>
constexpr GemmTileEntry entry(const char* name) {
  return {
      {name, C::kRows, C::kCols}, &launch<C>, &wgmma_opt_in<&gemm_w8a8_kernel<C>, C::kSmemBytes>};
}
// Name: "w8a8.", rows of x x output features per CTA, stages; then shared memory per CTA.
// Per SM: one CTA of 137 KiB or more, two of 105 or 113, three of 73.
constexpr GemmTileEntry kTiles[] = {
    entry<W8a8Config<2, 8, 8>>("w8a8.8x128.s8"),    // 0: 137 KiB
    entry<W8a8Config<1, 8, 8>>("w8a8.8x64.s8"),     // 1: 73 KiB
    entry<W8a8Config<2, 16, 8>>("w8a8.16x128.s8"),  // 2: 145 KiB
    entry<W8a8Config<2, 32, 6>>("w8a8.32x128.s6"),  // 3: 121 KiB
    entry<W8a8Config<2, 64, 6>>("w8a8.64x128.s6"),  // 4: 145 KiB
    entry<W8a8Config<2, 8, 6>>("w8a8.8x128.s6"),    // 5: 103 KiB
    entry<W8a8Config<2, 16, 6>>("w8a8.16x128.s6"),  // 6: 109 KiB
};

// The x quantizer: warp w of the grid takes row w / blocks, block w % blocks (rows up to
// ld_x8_scale: those past m write their 0 scales only).
__global__ void quantize_x_fp8_kernel(const float* x, int64_t ld_x, int m, int k, int blocks,
                                      int scale_rows, Fp8Rows out) {
  pdl_enter();
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32);
  if (w >= int64_t(scale_rows) * blocks) return;
  const int row = int(w / blocks), kb = int(w % blocks);
  if (row >= m) {
    if (lane == 0) out.scales[int64_t(kb) * out.ld_scales + row] = 0.0f;
    return;
  }
  const int k0 = kb * kBlockK + 4 * lane;
  const float* xr = x + int64_t(row) * ld_x;
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = k0 + j < k ? xr[k0 + j] : 0.0f;
  uint32_t bytes = 0;
  const float s = encode_fp8_head<true>(v, bytes);
  if (k0 < k) *reinterpret_cast<uint32_t*>(out.codes + int64_t(row) * out.ld + k0) = bytes;
  if (lane == 0) out.scales[int64_t(kb) * out.ld_scales + row] = s;
}

}  // namespace

int w8a8_tile_count() { return int(std::size(kTiles)); }

GemmTileInfo w8a8_tile_info(int tile) { return tile_info_in(kTiles, tile); }

int w8a8_pick_tile(int m) {
  // Up to 8 rows: 64-feature tiles, three CTAs per SM (on the H100 the fastest or within 7% of it
  // for every V3.2 projection at B = 1: bench/results/2026-12-07-h100-w8a8.md). Then the first
  // 128-feature tile whose rows hold m, else the largest.
  if (m <= 8) return 1;
  if (m <= 16) return 2;
  if (m <= 32) return 3;
  return 4;
}

cudaError_t w8a8_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= w8a8_tile_count() || !p.nk || !p.w8 || !p.x8 || !p.x8_scale) {
    return cudaErrorInvalidValue;
  }
  return kTiles[tile].launch(p, stream);
}

cudaError_t w8a8_prepare() { return opt_in_all(kTiles); }

size_t w8a8_x_bytes(int m, int k) {
  const size_t codes = (size_t(m) * size_t(k) + 255) / 256 * 256;
  const size_t blocks = (size_t(k) + kBlockK - 1) / kBlockK;
  return codes + blocks * size_t(w8a8_scale_ld(m)) * sizeof(float);
}

int64_t w8a8_scale_ld(int m) { return (int64_t(m) + 7) / 8 * 8; }

Fp8Rows w8a8_x_rows(void* scratch, int m, int k) {
  uint8_t* codes = static_cast<uint8_t*>(scratch);
  float* scales = reinterpret_cast<float*>(codes + (size_t(m) * size_t(k) + 255) / 256 * 256);
  return {codes, scales, int64_t(k), w8a8_scale_ld(m)};
}

cudaError_t quantize_fp8_rows(const float* x, int64_t ld_x, int m, int k, const Fp8Rows& out,
                              bool zero_pad, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k <= 0 || k % 16 != 0 || ld_x < k || !x || !out.codes || !out.scales || out.ld < k ||
      out.ld % 4 != 0 || (reinterpret_cast<uintptr_t>(out.codes) & 3u) != 0 || out.ld_scales < m) {
    return cudaErrorInvalidValue;
  }
  const int blocks = int(ceil_div(k, kBlockK));
  const int scale_rows = zero_pad ? int(std::min<int64_t>(w8a8_scale_ld(m), out.ld_scales)) : m;
  constexpr int kThreads = 128;
  const int64_t warps = int64_t(scale_rows) * blocks;
  launch_kernel(quantize_x_fp8_kernel, ceil_div(warps * 32, kThreads), kThreads, 0, stream, x, ld_x,
                m, k, blocks, scale_rows, out);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
