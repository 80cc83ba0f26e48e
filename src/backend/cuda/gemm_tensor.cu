// The batch-invariant GEMM's mma.sync kernel (GemmKernel::kMma): every weight layout (kNK and
// kKN) and fp8 weights. gemm_invariant.cu has the entry point, the contract (x rounded to bf16,
// f32 tensor-core sums, the bound against the CPU), the split plan and the reduction.
//
// The chain (gemm_invariant.cu's header, 2.): within a slice, one warp owns the element and runs
// one chain of mma.sync m16n8k16 (bf16 inputs, f32 accumulate) over the slice's k16 blocks in
// ascending order, starting from +0: exactly ceil(len / 16) blocks, the last one zero-filled past
// the slice end (+0 products; both operands are +0 there), and no block past it is ever
// multiplied (the compute loop stops at the slice end). The tile configuration (kTiles: rows and
// columns per CTA, k per stage, stages, warps; picked per call from m, n, k and batch) only
// decides WHICH warp runs the chain, where its row sits in the 16-row fragment and how many k16
// blocks a pipeline stage holds; the tensor core computes each D[i][j] from row i of A, column j
// of B and C[i][j] alone, so the chain's bits do not depend on any of that. The wgmma kernels
// run other chains (other bits, each batch-invariant).
// Rows of x at or beyond m are never read (zero-filled) and rows of y beyond m never written.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 fragments (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"); lane = 4 * g + t, g in [0, 8), t in [0, 4). A 32-bit
// register holds two bf16 with the lower k in its low half:
//   A (16 x 16, row-major, 4 regs): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
//                                   a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col-major", 2 regs): b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8 f32, 4 regs): c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// The fragments come from shared memory by ldmatrix (four 8 x 8 matrices per instruction; the
// lane-to-row map is at the kernel). Shared memory: x as xs[row][k]; kNK weights as ws[col][k];
// each row kBK + 8 bf16 (80, 144 or 272 B: a multiple of 16 B for cp.async and ldmatrix, and
// the 8 rows of one 8 x 8 matrix start in 8 distinct 16-byte bank groups, 5, 9 or 17 groups
// apart mod 8). kKN weights stay n-contiguous, ws[k][col] with rows of kBN + 8 bf16 (the same
// argument), read with ldmatrix.trans.
//
// fp8 weights (GemmParams::w_fp8: e4m3 bytes, kNK, one f32 scale per 128 x 128 block; the mma
// kernel only, gemm_tensor_kernel<C, true>): the stage holds the weight tile as fp8 bytes,
// wq[col][k] with rows of kBK + 16 bytes (48, 80 or 144: multiples of 16 for cp.async, and lane
// 4 g + t's 2-byte reads at row g, byte 2t fall in 8 distinct bank pairs), so the global traffic
// of the weights halves. The B fragment is built from it directly, no ldmatrix: b0 = B[2t, 2t+1]
// [g] is w[col g][k 2t, 2t+1], two adjacent bytes, and b1 the two 8 further; dequant_fp8x2 turns
// each pair into the bf16x2 register that dsa::dequant_fp8_weight gives element by element (the
// same bits: e4m3 -> f16 -> f32 are exact, then one f32 multiply and one bf16 rounding, both
// nearest even). A slice starts on a 128 boundary and kBK divides 128, so one stage lies in one
// scale block along k; the CTA's scales (at most two 128-column blocks by the slice's k blocks)
// are read once into shared memory before the main loop. Everything else (the chains, the
// split plan, the reduction) is the bf16 path's, so the bits are those of the bf16 GEMM on the
// dequantized matrix. A zero-filled byte (past k or n) dequantizes to +0 when its scale is
// finite (ops.h asks for finite scales), as the bf16 path's zero fill.
// Napkin, o_proj at B = 1 (n 7168, k 16384): 117 MB of fp8 instead of 235 MB of bf16, 28 us
// instead of 55 us at 4.25 TB/s; the conversion is 3 instructions per weight (cvt e4m3x2, two cvt
// f16, two fmul, one cvt bf16x2 per pair), 117M / 32 lanes * 3 / (132 SMs * 4 issue * 1.8 GHz)
// = 12 us of issue, hidden under the loads as long as m needs one x tile (m <= kBM).
//
// Loads: 16-byte cp.async.cg (L2 only) when every address is 16-byte aligned (bases, row and
// batch strides multiples of 8 elements; slice and stage starts are multiples of kBK, tile
// columns multiples of 8), else element loads with zero fill, for any k, n and m. kStages-deep
// pipeline: the standard wait_group(kStages - 2) / __syncthreads / prefetch / compute loop.
// Shared memory is dynamic (up to 162 KiB per CTA); each kernel opts in once per device.
#include <algorithm>
#include <atomic>
#include <iterator>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_fp8.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/pdl.h"

namespace dsa::cuda {
namespace {

template <int kWarpsM_, int kWarpsN_, int kTilesM_, int kTilesN_, int kBK_, int kStages_>
struct TileConfig {
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;  // warps over m and n
  static constexpr int kTilesM = kTilesM_, kTilesN = kTilesN_;  // m16 and n8 tiles per warp
  static constexpr int kBK = kBK_;                              // k per pipeline stage
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBM = 16 * kTilesM * kWarpsM;
  static constexpr int kBN = 8 * kTilesN * kWarpsN;
  static constexpr int kRow = kBK + 8;   // bf16 per k-contiguous shared row
  static constexpr int kRowN = kBN + 8;  // bf16 per n-contiguous shared row (kKN weights)
  // x [kBM][kRow], then w as [kBN][kRow] (kNK) or [kBK][kRowN] (kKN), the larger of the two.
  static constexpr int kStageElems =
      kBM * kRow + (kBN * kRow > kBK * kRowN ? kBN * kRow : kBK * kRowN);
  static constexpr int kSmemBytes = kStages * kStageElems * 2;
  // fp8 weights (kNK): x as above, then wq [kBN][kRowQ] bytes; after the stages, the scales
  // [2][kGemmFp8MaxSliceBlocks] f32.
  static constexpr int kRowQ = kBK + 16;  // bytes per fp8 weight row
  static constexpr int kStageElemsFp8 = kBM * kRow + kBN * kRowQ / 2;
  static constexpr int kSmemBytesFp8 =
      kStages * kStageElemsFp8 * 2 + 2 * kGemmFp8MaxSliceBlocks * 4;
  static_assert(kBN <= 256 && 128 % kBK == 0, "fp8: a CTA's columns span at most 2 scale blocks");
  static_assert(kTilesN % 2 == 0, "B fragments come two n8 tiles per ldmatrix.x4");
  static_assert(kGemmSliceGranule % kBK == 0 && kBK % 16 == 0, "a stage holds whole k16 blocks");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
  static_assert(kSmemBytesFp8 <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

// Rows [row0, row0 + kRows) x k [k0, k0 + kBK) of a k-contiguous bf16 matrix into
// dst[kRows][kBK + 8]. Rows >= row_end and k >= k_end become +0 and are never read.
template <class C, int kRows>
__device__ __forceinline__ void load_k_contiguous(uint16_t* dst, const uint16_t* src, int64_t ld,
                                                  int row0, int row_end, int k0, int k_end,
                                                  bool vec) {
  constexpr int kChunksPerRow = C::kBK / 8;  // 16-byte chunks
#pragma unroll 4
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += C::kThreads) {
    const int r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
    const int row = row0 + r, k = k0 + kc;
    load_chunk(dst + r * C::kRow + kc, src + int64_t(row) * ld + k, row < row_end, k_end - k, vec);
  }
}

// k [k0, k0 + kBK) x columns [n0, n0 + kBN) of a [k, n] bf16 matrix (kKN) into
// dst[kBK][kBN + 8], n-contiguous as in memory. Columns >= n_end and k >= k_end become +0.
template <class C>
__device__ __forceinline__ void load_n_contiguous(uint16_t* dst, const uint16_t* src, int64_t ld,
                                                  int n0, int n_end, int k0, int k_end, bool vec) {
  constexpr int kChunksPerRow = C::kBN / 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < C::kBK * kChunksPerRow; c += C::kThreads) {
    const int kk = c / kChunksPerRow, nc = (c % kChunksPerRow) * 8;
    const int k = k0 + kk, n = n0 + nc;
    load_chunk(dst + kk * C::kRowN + nc, src + int64_t(k) * ld + n, k < k_end, n_end - n, vec);
  }
}

// kFp8: the weights are p.w8 (fp8 bytes, kNK) with their block scales; see the header comment.
template <class C, bool kFp8>
__global__ void __launch_bounds__(C::kThreads, 1) gemm_tensor_kernel(TcParams p) {
  pdl_enter();
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int kStageElems = kFp8 ? C::kStageElemsFp8 : C::kStageElems;
  const int b = int(blockIdx.z) % p.batch, s = int(blockIdx.z) / p.batch;
  // m tiles are the fastest grid index: the CTAs that share a weight tile run side by side, so
  // its second reader finds it in L2 (x, the small operand, is what is read again).
  const int m0 = int(blockIdx.x) * C::kBM, n0 = int(blockIdx.y) * C::kBN;
  const int k_begin = s * p.slice_k;
  const int k_end = min(p.k, k_begin + p.slice_k);
  const int k_len = k_end - k_begin;
  const int tiles = (k_len + C::kBK - 1) / C::kBK;
  const uint16_t* x = p.x + int64_t(b) * p.bs_x;
  const uint16_t* w = p.w + int64_t(b) * p.bs_w;

  auto load_stage = [&](int stage, int tile) {
    uint16_t* xs = smem + stage * kStageElems;
    uint16_t* ws = xs + C::kBM * C::kRow;
    const int k0 = k_begin + tile * C::kBK;
    load_k_contiguous<C, C::kBM>(xs, x, p.ld_x, m0, p.m, k0, k_end, p.vec_x);
    if constexpr (kFp8) {
      load_fp8_rows<C>(reinterpret_cast<uint8_t*>(ws), p.w8, p.ld_w, n0, p.n, k0, k_end, p.vec_w);
    } else if (p.nk) {
      load_k_contiguous<C, C::kBN>(ws, w, p.ld_w, n0, p.n, k0, k_end, p.vec_w);
    } else {
      load_n_contiguous<C>(ws, w, p.ld_w, n0, p.n, k0, k_end, p.vec_w);
    }
  };

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_m = (warp / C::kWarpsN) * C::kTilesM * 16;  // the warp's first row in the tile
  const int warp_n = (warp % C::kWarpsN) * C::kTilesN * 8;   // and its first column
  // This lane's ldmatrix row addresses (see ldmatrix_x4), as offsets into a stage:
  //   A, m16 tile i: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
  //     (rows 8-15, k 8-15) are a0..a3; lane l gives row l % 16 at k 8 (l / 16).
  //   B nk (ws[n][k]), n8 tiles j, j + 1: (n 0-7, k 0-7), (n 0-7, k 8-15) are b0, b1 of tile j
  //     and the next two those of tile j + 1; lane l gives column 8 (l / 16) + l % 8 at
  //     k 8 ((l / 8) % 2).
  //   B kn (ws[k][n], .trans): the same four matrices stored k-major; lane l gives k row
  //     8 ((l / 8) % 2) + l % 8 at column 8 (l / 16).
  const int a_off = (warp_m + lane % 16) * C::kRow + 8 * (lane / 16);
  const int b_off = p.nk ? (warp_n + 8 * (lane / 16) + lane % 8) * C::kRow + 8 * ((lane / 8) % 2)
                         : (8 * ((lane / 8) % 2) + lane % 8) * C::kRowN + warp_n + 8 * (lane / 16);
  float acc[C::kTilesM][C::kTilesN][4];
#pragma unroll
  for (int i = 0; i < C::kTilesM; ++i) {
#pragma unroll
    for (int j = 0; j < C::kTilesN; ++j)
      acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  }

  // Commit group i carries tile i (empty groups past the last tile keep the count regular).
#pragma unroll
  for (int st = 0; st < C::kStages - 1; ++st) {
    if (st < tiles) load_stage(st, st);
    cp_async_commit();
  }
  // fp8: the scales of the CTA's (at most two) 128-column blocks over the slice's k blocks, read
  // while the first stages are in flight; the main loop's first barrier publishes them.
  // scales[nb][kb] is block (n0 / 128 + nb, k_begin / 128 + kb); 1 past the last column block.
  float* scales = reinterpret_cast<float*>(smem + C::kStages * kStageElems);
  if constexpr (kFp8) {
    const int kbs = (k_len + 127) / 128, nb0 = n0 / 128, nbs = (p.n + 127) / 128;
    for (int e = threadIdx.x; e < 2 * kbs; e += C::kThreads) {
      const int nb = e / kbs, kb = e % kbs;
      scales[nb * kGemmFp8MaxSliceBlocks + kb] =
          nb0 + nb < nbs ? p.w8_scale[int64_t(nb0 + nb) * p.ld_w8_scale + k_begin / 128 + kb]
                         : 1.0f;
    }
  }
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<C::kStages - 2>();  // groups 0..kt have landed (for this thread)
    __syncthreads();                  // ... for every thread; and stage (kt - 1) is consumed
    const int next = kt + C::kStages - 1;
    if (next < tiles) load_stage(next % C::kStages, next);
    cp_async_commit();

    const uint16_t* xs = smem + (kt % C::kStages) * kStageElems;
    const uint16_t* ws = xs + C::kBM * C::kRow;
    const int k_valid = k_len - kt * C::kBK;  // > 0: the k16 blocks at or past it are skipped
    // fp8: this lane's column of n8 tile j is warp_n + 8 j + g, and its scale is the one of the
    // stage's k block (a stage never crosses one).
    float scale[C::kTilesN];
    if constexpr (kFp8) {
#pragma unroll
      for (int j = 0; j < C::kTilesN; ++j) {
        const int nb = (n0 % 128 + warp_n + 8 * j + g) / 128;
        scale[j] = scales[nb * kGemmFp8MaxSliceBlocks + kt * C::kBK / 128];
      }
    }
#pragma unroll
    for (int kk = 0; kk < C::kBK; kk += 16) {
      if (kk >= k_valid) break;
      uint32_t a[C::kTilesM][4], bw[C::kTilesN][2];
#pragma unroll
      for (int i = 0; i < C::kTilesM; ++i) ldmatrix_x4(a[i], xs + a_off + 16 * i * C::kRow + kk);
#pragma unroll
      for (int j = 0; j < C::kTilesN && kFp8; ++j) {
        const uint8_t* q =
            reinterpret_cast<const uint8_t*>(ws) + (warp_n + 8 * j + g) * C::kRowQ + kk + 2 * t;
        bw[j][0] = dequant_fp8x2(*reinterpret_cast<const uint16_t*>(q), scale[j]);
        bw[j][1] = dequant_fp8x2(*reinterpret_cast<const uint16_t*>(q + 8), scale[j]);
      }
#pragma unroll
      for (int j = 0; j < C::kTilesN && !kFp8; j += 2) {
        uint32_t r[4];
        if (p.nk) {
          ldmatrix_x4(r, ws + b_off + 8 * j * C::kRow + kk);
        } else {
          ldmatrix_x4_trans(r, ws + b_off + kk * C::kRowN + 8 * j);
        }
        bw[j][0] = r[0], bw[j][1] = r[1], bw[j + 1][0] = r[2], bw[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < C::kTilesM; ++i) {
#pragma unroll
        for (int j = 0; j < C::kTilesN; ++j) mma_bf16(acc[i][j], a[i], bw[j][0], bw[j][1]);
      }
    }
  }
  cp_async_wait<0>();  // nothing is in flight past here (the trailing groups are empty)

#pragma unroll
  for (int i = 0; i < C::kTilesM; ++i) {
#pragma unroll
    for (int j = 0; j < C::kTilesN; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + warp_m + 16 * i + g + 8 * (r / 2);
        const int col = n0 + warp_n + 8 * j + 2 * t + r % 2;
        if (row < p.m && col < p.n) store_chain(p, b, s, row, col, acc[i][j][r]);
      }
    }
  }
  if (p.splits == 1 || !p.fused) return;
  // One counter per (batch entry, n tile, m tile): the same for every slice of the tile.
  const int64_t tile = (int64_t(b) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  finish_split_tile<C::kThreads>(p, b, tile, m0, min(C::kBM, p.m - m0), n0, min(C::kBN, p.n - n0));
}

template <class C, bool kFp8>
constexpr int smem_bytes() {
  return kFp8 ? C::kSmemBytesFp8 : C::kSmemBytes;
}

// gemm_invariant_prepare opts every tile in before any capture (opt_in_smem), bf16 and fp8.
template <class C, bool kFp8>
cudaError_t opt_in_one(bool force) {
  static std::atomic<uint64_t> opted_in{0};
  return opt_in_smem(reinterpret_cast<const void*>(&gemm_tensor_kernel<C, kFp8>),
                     smem_bytes<C, kFp8>(), force, opted_in);
}
template <class C>
cudaError_t opt_in(bool force) {
  const cudaError_t err = opt_in_one<C, false>(force);
  return err != cudaSuccess ? err : opt_in_one<C, true>(force);
}

template <class C>
cudaError_t launch_tiles(const TcParams& p, cudaStream_t stream) {
  const bool fp8 = p.w8 != nullptr;
  const cudaError_t err = fp8 ? opt_in_one<C, true>(false) : opt_in_one<C, false>(false);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(p.m, C::kBM), ceil_div(p.n, C::kBN), unsigned(p.batch * p.splits));
  if (fp8) {
    launch_kernel(gemm_tensor_kernel<C, true>, grid, C::kThreads, smem_bytes<C, true>(), stream, p);
  } else {
    launch_kernel(gemm_tensor_kernel<C, false>, grid, C::kThreads, smem_bytes<C, false>(), stream,
                  p);
  }
  return cudaGetLastError();
}

template <class C>
constexpr GemmTileEntry entry(const char* name) {
  return {{name, C::kBM, C::kBN}, &launch_tiles<C>, &opt_in<C>};
}
// The tile configurations, by index (GemmInvariantTuning::tile and gemm_invariant.cu's default
// table name them by it). Every one runs the same chains (header comment, 2.), so the choice is
// free per call. Name: rows x columns per CTA, k per stage, stages; then threads and shared memory
// per CTA.
constexpr GemmTileEntry kTiles[] = {
    entry<TileConfig<1, 2, 1, 2, 32, 6>>("16x32.k32.s6"),     // 0: 64, 22.5 KiB
    entry<TileConfig<1, 4, 1, 2, 64, 6>>("16x64.k64.s6"),     // 1: 128, 67.5 KiB
    entry<TileConfig<1, 4, 1, 2, 128, 4>>("16x64.k128.s4"),   // 2: 128, 89 KiB
    entry<TileConfig<1, 8, 1, 2, 64, 6>>("16x128.k64.s6"),    // 3: 256, 121.5 KiB
    entry<TileConfig<1, 8, 1, 2, 128, 4>>("16x128.k128.s4"),  // 4: 256, 153 KiB
    entry<TileConfig<2, 2, 2, 4, 64, 4>>("64x64.k64.s4"),     // 5: 128, 72 KiB
    entry<TileConfig<2, 4, 2, 4, 64, 4>>("64x128.k64.s4"),    // 6: 256, 108 KiB
    entry<TileConfig<2, 2, 2, 8, 32, 6>>("64x128.k32.s6"),    // 7: 128, 90 KiB
    entry<TileConfig<2, 4, 4, 4, 32, 4>>("128x128.k32.s4"),   // 8: 256, 80 KiB
    entry<TileConfig<2, 4, 4, 4, 64, 3>>("128x128.k64.s3"),   // 9: 256, 108 KiB
    entry<TileConfig<2, 4, 4, 8, 32, 4>>("128x256.k32.s4"),   // 10: 256, 120 KiB
    entry<TileConfig<2, 4, 4, 8, 64, 3>>("128x256.k64.s3"),   // 11: 256, 162 KiB
    entry<TileConfig<4, 2, 4, 8, 64, 3>>("256x128.k64.s3"),   // 12: 256, 162 KiB
    entry<TileConfig<1, 8, 1, 4, 64, 4>>("16x256.k64.s4"),    // 13: 256, 153 KiB
    entry<TileConfig<2, 4, 2, 8, 64, 3>>("64x256.k64.s3"),    // 14: 256, 135 KiB
};

}  // namespace

int mma_tile_count() { return int(std::size(kTiles)); }
GemmTileInfo mma_tile_info(int tile) { return tile_info_in(kTiles, tile); }
cudaError_t mma_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= mma_tile_count()) return cudaErrorInvalidValue;
  if (p.cluster) return cudaErrorNotSupported;  // it reduces through partial only
  return kTiles[tile].launch(p, stream);
}
cudaError_t mma_prepare() { return opt_in_all(kTiles); }

}  // namespace dsa::cuda
