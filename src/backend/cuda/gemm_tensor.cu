// The batch-invariant tensor-core GEMM (GemmMode::kBatchInvariant, `--gemm invariant`), its
// mma.sync kernel and its entry point gemm_invariant, which runs this kernel or the wgmma one
// (gemm_wgmma.cu, kNK weights) as GemmInvariantTuning::kernel says (the backend fills it from
// DSA_CUDA_GEMM); both share the split plan and the reduction below (gemm_invariant.cuh).
//
//   y_b[m, n] (+)= alpha * sum_k bf16(x_b[m, k]) * w_b(n, k)
//
// x is ROUNDED TO BF16 (round to nearest even, dsa::float_to_bf16) before it is multiplied: the
// backend converts it (or takes the bf16 copy the producing norm wrote, which holds the same
// bits). w is bf16 already. Products are exact in f32 and are summed in f32 by the tensor cores
// (mma.sync m16n8k16, bf16 inputs, f32 accumulate). This is therefore NOT bit-identical to
// cpu/gemm.cpp (f32 x, sequential sum); it agrees within the bound tests/parity/test_parity_gemm
// derives and checks. GemmMode::kExact (gemm.cu) is the bit-identical one.
//
// Batch invariance: the value of y[m, n] is a fixed function of row m of x, column n of w, K,
// N and the batch count, never of the row count m or of the other rows:
//   1. K is cut into `splits` slices of `slice_k` (a multiple of kSliceGranule) columns. splits
//      comes from K, N and batch only (split_plan: the default table, else a formula; a sweep's
//      GemmInvariantTuning::splits fixes it for every shape alike); never from m or the tile.
//   2. Within a slice, one warp owns the element and runs one chain of mma.sync over the
//      slice's k16 blocks in ascending order, starting from +0: exactly ceil(len / 16) blocks,
//      the last one zero-filled past the slice end (+0 products; both operands are +0 there),
//      and no block past it is ever multiplied (the compute loop stops at the slice end). The
//      tile configuration (kTiles: rows and columns per CTA, k per stage, stages, warps; picked
//      per call from m, n, k and batch) only decides WHICH warp runs the chain, where its row
//      sits in the 16-row fragment and how many k16 blocks a pipeline stage holds; the tensor
//      core computes each D[i][j] from row i of A, column j of B and C[i][j] alone, so the
//      chain's bits do not depend on any of that.
//   3. One slice: y = alpha * acc (or y + alpha * acc). Several: every slice writes its chain's
//      result to `partial`, and they are added in slice order 0, 1, ... in f32 (__fadd_rn),
//      then alpha applied the same way: by the last CTA of the output tile to arrive (fused,
//      counted with one atomic counter per tile) or by reduce_splits_kernel; the two run the
//      same additions on the same values, so which one runs (or which CTA is last) never
//      changes a bit.
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
#include <array>
#include <atomic>
#include <cstring>
#include <iterator>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_fp8.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"

namespace dsa::cuda {
namespace {

constexpr int kSliceGranule = 128;          // slice_k is a multiple of it; every kBK divides it
constexpr int kSplitRefCols = 32;           // the column width split_plan counts CTAs with
constexpr int kSplitTargetCtas = 512;       // about four CTAs per SM of an H200 (132 SMs)
constexpr int kMinSliceK = 512;             // a slice is never shorter (split_plan's own choice)
constexpr int64_t kMaxPartialCols = 73728;  // splits * batch * n whenever splits > 1 (see below)
// The arrival counters of the fused split reduction sit at the start of the scratch buffer, one
// per output tile; a launch with more output tiles reduces with reduce_splits_kernel instead.
constexpr int kSplitCounters = 16384;
// The largest output tile (rows x columns) whose split reduction is fused by default.
constexpr int kFusedReduceMaxTile = 32 * 128;
// fp8 weights: the most 128-wide k blocks of one slice (slice_k <= 32768) whose scales a CTA
// keeps in shared memory; gemm_invariant refuses a plan with longer slices.
constexpr int kFp8MaxSliceBlocks = 256;

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
  // [2][kFp8MaxSliceBlocks] f32.
  static constexpr int kRowQ = kBK + 16;  // bytes per fp8 weight row
  static constexpr int kStageElemsFp8 = kBM * kRow + kBN * kRowQ / 2;
  static constexpr int kSmemBytesFp8 = kStages * kStageElemsFp8 * 2 + 2 * kFp8MaxSliceBlocks * 4;
  static_assert(kBN <= 256 && 128 % kBK == 0, "fp8: a CTA's columns span at most 2 scale blocks");
  static_assert(kTilesN % 2 == 0, "B fragments come two n8 tiles per ldmatrix.x4");
  static_assert(kSliceGranule % kBK == 0 && kBK % 16 == 0, "a stage holds whole k16 blocks");
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
      scales[nb * kFp8MaxSliceBlocks + kb] =
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
        scale[j] = scales[nb * kFp8MaxSliceBlocks + kt * C::kBK / 128];
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

// y = alpha * (((partial_0 + partial_1) + partial_2) + ...), or y + that; one thread an element.
__global__ void reduce_splits_kernel(TcParams p, int64_t total) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t per_slice = int64_t(p.batch) * p.m * p.n;
  const int col = int(e % p.n);
  const int row = int(e / p.n % p.m);
  const int b = int(e / (int64_t(p.n) * p.m));
  float sum = p.partial[e];
  for (int s = 1; s < p.splits; ++s) sum = __fadd_rn(sum, p.partial[s * per_slice + e]);
  float* out = p.y + int64_t(b) * p.bs_y + int64_t(row) * p.ld_y + col;
  const float scaled = __fmul_rn(p.alpha, sum);
  *out = p.accumulate ? __fadd_rn(*out, scaled) : scaled;
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
    gemm_tensor_kernel<C, true><<<grid, C::kThreads, smem_bytes<C, true>(), stream>>>(p);
  } else {
    gemm_tensor_kernel<C, false><<<grid, C::kThreads, smem_bytes<C, false>(), stream>>>(p);
  }
  return cudaGetLastError();
}

struct TileEntry {
  const char* name;
  cudaError_t (*launch)(const TcParams&, cudaStream_t);
  cudaError_t (*opt_in)(bool force);
  int bm, bn;
};
template <class C>
constexpr TileEntry entry(const char* name) {
  return {name, &launch_tiles<C>, &opt_in<C>, C::kBM, C::kBN};
}
// The tile configurations, by index (GemmInvariantTuning::tile and the default table name them
// by it). Every one runs the same chains (header comment, 2.), so the choice is free per call.
// Name: rows x columns per CTA, k per stage, stages; then threads and shared memory per CTA.
constexpr TileEntry kTiles[] = {
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
constexpr int kTileCount = int(std::size(kTiles));

// The default table. Per shape (n, k, batch): the split count (0: split_plan's formula) and the
// tile for each class of m: m <= 16, m <= 64, m > 64 (-1: the class default below). Chosen from
// a sweep of dsa_gpu_bench --gemm-sweep (scripts/gpu-gemm-sweep.sh) on an H200. The split count
// is per shape, never per class: that is the invariance (header comment, 1.).
struct ShapeChoice {
  int n, k, batch, splits;
  int tile[3];             // mma.sync tiles (kTiles below)
  const char* wg_tile[3];  // wgmma tiles by name (gemm_wgmma.cu), nullptr: wgmma_pick_tile
};
constexpr int kClassTile[3] = {
    2, 6, 6};  // 16 x 64 k128, 64 x 128 k64 (the sweep: it beat 128 x 128 at B = 256)
constexpr ShapeChoice kShapeTable[] = {
    // The V3.2 projections (bench/gpu/bench_gemm.cpp names them). Split counts: the wgmma
    // kernel's sweeps of 2026-12-04 on the H200 (bench/results/2026-12-04-h200-gemm-tma.md: the
    // count with the least worst ratio to cuBLASLt over B = 1, 8, 64, 256, every shape but
    // kv_b absorb, whose kKN layout runs on mma.sync and keeps the 2026-12-03 sweep's count).
    // mma tiles: the 2026-12-03 sweep's. wgmma tiles: the 2026-12-04 sweeps' (nullptr would
    // leave the pick to wgmma_pick_tile).
    // q_a
    {1536, 7168, 1, 4, {4, 6, 6}, {"tma.8x64.s8", "tma.16x128.s6", "tma.64x128.s4"}},
    // q_b
    {128 * 192, 1536, 1, 1, {1, 6, 6}, {"tma.8x64.s8", "tma.64x128.s4", "tma.64x128.s4"}},
    // kv_a
    {576, 7168, 1, 8, {2, 0, 6}, {"tma.8x64.s8", "tma.16x128.s6", "tma.64x128.s4"}},
    // kv_b absorb (kKN: mma only)
    {512, 128, 128, 1, {13, 9, 6}, {nullptr, nullptr, nullptr}},
    // kv_b up
    {128, 512, 128, 1, {4, 6, 12}, {"tma.8x128.s6", "tma.32x128.s5", "tma.64x128.s4"}},
    // o
    {7168, 128 * 128, 1, 2, {13, 6, 6}, {"tma.8x128.s6", "tma.32x128.s5", "tma.256x128.s4"}},
    // indexer wq_b
    {64 * 128, 1536, 1, 1, {2, 5, 6}, {"tma.8x64.s8", "tma.64x64.s6", "tma.64x128.s4"}},
    // indexer wk
    {128, 7168, 1, 8, {2, 2, 5}, {"tma.8x64.s8", "tma.8x64.s8", "tma.16x128.s6"}},
    // indexer weights_proj
    {64, 7168, 1, 8, {2, 2, 5}, {"tma.8x64.s8", "tma.8x64.s8", "tma.8x64.s8"}},
    // mlp gate / up
    {18432, 7168, 1, 1, {1, 6, 6}, {"tma.8x128.s6", "tma.64x128.s4", "tma.128x128.s5"}},
    // mlp down
    {7168, 18432, 1, 2, {13, 6, 6}, {"tma.8x128.s6", "tma.32x128.s5", "tma.256x128.s4"}},
    // lm_head
    {32768, 7168, 1, 1, {13, 6, 11}, {"tma.8x128.s6", "tma.64x128.s4", "tma.256x128.s4"}},
};
// Every table entry that splits keeps splits * batch * n within kMaxPartialCols (the scratch
// bound below relies on it).
constexpr bool table_within_partial_bound() {
  for (const ShapeChoice& c : kShapeTable) {
    if (c.splits > 1 && int64_t(c.splits) * c.batch * c.n > kMaxPartialCols) return false;
    for (int t : c.tile) {
      if (t < -1 || t >= kTileCount) return false;
    }
  }
  return true;
}
static_assert(table_within_partial_bound(), "a table entry breaks the scratch bound or a tile");

const ShapeChoice* find_shape(int n, int k, int batch) {
  for (const ShapeChoice& c : kShapeTable) {
    if (c.n == n && c.k == k && c.batch == batch) return &c;
  }
  return nullptr;
}

struct SplitPlan {
  int splits, slice_k;
};

// From K, N and batch only (never m), so every row of every batch size sums in the same order:
// the tuning's count when it gives one (the sweep), else the table's, else the formula. Few
// output tiles (small n, one weight matrix) leave SMs idle at decode sizes, so the formula cuts
// K until about kSplitTargetCtas CTAs of kSplitRefCols columns exist, but never into slices
// shorter than kMinSliceK. When splits > 1: batch * ceil(n / 32) = c < 512 and
// splits <= ceil(512 / c), so splits * batch * n <= (512 / c + 1) * 32 c < 32768 <=
// kMaxPartialCols, which bounds the partial buffer at kMaxPartialCols floats per row of x
// (table_within_partial_bound checks the table's counts against the same bound).
SplitPlan split_plan(int n, int k, int batch, const GemmInvariantTuning& tuning) {
  int splits = 1;
  const ShapeChoice* choice = find_shape(n, k, batch);
  if (tuning.splits > 0) {
    splits = tuning.splits;
  } else if (choice && choice->splits > 0) {
    splits = choice->splits;
  } else {
    const int64_t ctas = int64_t(batch) * ceil_div(n, kSplitRefCols);
    if (ctas < kSplitTargetCtas) {
      splits = int(ceil_div(int64_t(kSplitTargetCtas), ctas));
      splits = std::min(splits, std::max(1, k / kMinSliceK));
    }
  }
  const int slice_k = int(ceil_div(ceil_div(k, splits), kSliceGranule) * kSliceGranule);
  return {int(ceil_div(k, slice_k)), slice_k};
}

// Any function of anything may pick the tile (it never changes a bit); this one uses m's class.
int pick_tile(int m, int n, int k, int batch, const GemmInvariantTuning& tuning) {
  if (tuning.tile >= 0 && tuning.tile < kTileCount) return tuning.tile;
  const int cls = m <= 16 ? 0 : m <= 64 ? 1 : 2;
  const ShapeChoice* choice = find_shape(n, k, batch);
  if (choice && choice->tile[cls] >= 0) return choice->tile[cls];
  return kClassTile[cls];
}

// The table's wgmma tile for m rows of (n, k, batch), as an index (names resolved once), or -1.
int table_wgmma_tile(int m, int n, int k, int batch) {
  constexpr int kShapes = int(std::size(kShapeTable));
  static const std::array<std::array<int, 3>, kShapes> resolved = [] {
    std::array<std::array<int, 3>, kShapes> out{};
    for (int i = 0; i < kShapes; ++i) {
      for (int c = 0; c < 3; ++c) {
        out[i][c] = -1;
        const char* want = kShapeTable[i].wg_tile[c];
        for (int t = 0; want && t < wgmma_tile_count(); ++t) {
          if (std::strcmp(wgmma_tile_info(t).name, want) == 0) out[i][c] = t;
        }
      }
    }
    return out;
  }();
  const ShapeChoice* choice = find_shape(n, k, batch);
  if (!choice) return -1;
  return resolved[choice - kShapeTable][m <= 16 ? 0 : m <= 64 ? 1 : 2];
}

size_t partial_floats(const GemmParams& p, const SplitPlan& plan) {
  return plan.splits == 1 ? 0 : size_t(plan.splits) * p.batch * p.m * p.n;
}

}  // namespace

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kMma:
      return "mma";
    case GemmKernel::kWgmma:
      return "wgmma";
    default:
      return "default";
  }
}

namespace {
bool is_wgmma(GemmKernel kernel) {
  return (kernel == GemmKernel::kDefault ? kDefaultGemmKernel : kernel) == GemmKernel::kWgmma;
}
// The tuning the mma.sync kernel runs under when the wgmma one was asked for but the layout is
// kKN: the same split count and reduction, the mma kernel's own tile pick.
GemmInvariantTuning mma_tuning(GemmInvariantTuning tuning) {
  if (is_wgmma(tuning.kernel)) tuning.tile = -1;
  tuning.kernel = GemmKernel::kMma;
  return tuning;
}
}  // namespace

int gemm_invariant_tile_count(GemmKernel kernel) {
  return is_wgmma(kernel) ? wgmma_tile_count() : kTileCount;
}
const char* gemm_invariant_tile_name(int tile, GemmKernel kernel) {
  if (tile < 0 || tile >= gemm_invariant_tile_count(kernel)) return "default";
  return is_wgmma(kernel) ? wgmma_tile_info(tile).name : kTiles[tile].name;
}
int gemm_invariant_tile_rows(int tile, GemmKernel kernel) {
  if (tile < 0 || tile >= gemm_invariant_tile_count(kernel)) return 0;
  return is_wgmma(kernel) ? wgmma_tile_info(tile).rows : kTiles[tile].bm;
}
int gemm_invariant_splits(int n, int k, int batch, const GemmInvariantTuning& tuning) {
  return n > 0 && k > 0 && batch > 0 ? split_plan(n, k, batch, tuning).splits : 0;
}
int gemm_invariant_tile(int m, int n, int k, int batch, const GemmInvariantTuning& tuning) {
  if (!is_wgmma(tuning.kernel)) return pick_tile(m, n, k, batch, tuning);
  if (tuning.tile >= 0 && tuning.tile < wgmma_tile_count()) return tuning.tile;
  const int tile = table_wgmma_tile(m, n, k, batch);
  return tile >= 0 ? tile : wgmma_pick_tile(m, n, batch, split_plan(n, k, batch, tuning).splits);
}

bool gemm_invariant_fp8_runs_wgmma(const GemmParams& p, const GemmInvariantTuning& tuning) {
  return p.w_fp8 != nullptr && is_wgmma(tuning.kernel) && tuning.fp8 == 1 &&
         p.layout == WeightLayout::kNK && p.batch == 1 && aligned16(p.w_fp8) && p.ld_w % 16 == 0 &&
         p.k % 8 == 0;
}
int gemm_invariant_fp8_tile_count() { return wgmma_fp8_tile_count(); }
const char* gemm_invariant_fp8_tile_name(int tile) { return wgmma_fp8_tile_info(tile).name; }
int gemm_invariant_fp8_tile(int m, const GemmInvariantTuning& tuning) {
  return tuning.fp8_tile >= 0 && tuning.fp8_tile < wgmma_fp8_tile_count() ? tuning.fp8_tile
                                                                          : wgmma_fp8_pick_tile(m);
}

cudaError_t gemm_invariant_prepare() {
  // Every wgmma tile the table names exists (a misspelt name would quietly fall back to
  // wgmma_pick_tile): the backend refuses to start otherwise.
  for (const ShapeChoice& c : kShapeTable) {
    for (int cls = 0; cls < 3; ++cls) {
      const int m = cls == 0 ? 1 : cls == 1 ? 64 : 256;
      if (c.wg_tile[cls] && table_wgmma_tile(m, c.n, c.k, c.batch) < 0) {
        return cudaErrorInvalidValue;
      }
    }
  }
  for (const TileEntry& tile : kTiles) {
    const cudaError_t err = tile.opt_in(true);
    if (err != cudaSuccess) return err;
  }
  if (const cudaError_t err = wgmma_prepare(); err != cudaSuccess) return err;
  return wgmma_fp8_prepare();
}

size_t gemm_invariant_scratch_floats(const GemmParams& p, const GemmInvariantTuning& tuning) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.batch <= 0) return 0;
  const size_t partial = partial_floats(p, split_plan(p.n, p.k, p.batch, tuning));
  return partial == 0 ? 0 : kSplitCounters + partial;
}

size_t gemm_invariant_scratch_floats_bound(int max_rows) {
  return kSplitCounters + size_t(std::max(max_rows, 0)) * size_t(kMaxPartialCols);
}

cudaError_t gemm_invariant(const GemmParams& p, const Bf16* x_bf16, int64_t ld_xb, int64_t bs_xb,
                           float* scratch, const GemmInvariantTuning& tuning, cudaStream_t stream) {
  const int64_t w_row = p.layout == WeightLayout::kNK ? p.k : p.n;
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.batch < 0 || ld_xb < p.k || p.ld_y < p.n ||
      p.ld_w < w_row) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0 || p.batch == 0) return cudaSuccess;
  const bool fp8 = p.w_fp8 != nullptr;
  if (!x_bf16 || (p.w == nullptr) == !fp8 || !p.y) return cudaErrorInvalidValue;
  if (fp8 && (!p.w_scale || p.layout != WeightLayout::kNK || p.batch != 1 ||
              p.ld_w_scale < ceil_div(p.k, kGemmFp8Block))) {
    return cudaErrorInvalidValue;
  }
  const SplitPlan plan = split_plan(p.n, p.k, p.batch, tuning);
  if (fp8 && plan.slice_k / kGemmFp8Block > kFp8MaxSliceBlocks) return cudaErrorInvalidValue;
  // The kernel follows the tuning, the layout and the weights (dtype, alignment, K), never m
  // (gemm_invariant.cuh): fp8 weights run on the mma.sync kernel unless the tuning asks for the
  // wgmma kernel's fp8 tiles and gemm_invariant_fp8_runs_wgmma holds.
  const bool wgmma_fp8 = fp8 && gemm_invariant_fp8_runs_wgmma(p, tuning);
  const bool wgmma = p.layout == WeightLayout::kNK && !fp8 && is_wgmma(tuning.kernel);
  int tile = 0;
  WgmmaTileInfo shape{};
  if (wgmma_fp8) {
    tile = gemm_invariant_fp8_tile(p.m, tuning);
    shape = wgmma_fp8_tile_info(tile);
  } else if (wgmma) {
    tile = gemm_invariant_tile(p.m, p.n, p.k, p.batch, tuning);
    shape = wgmma_tile_info(tile);
  } else {
    tile = gemm_invariant_tile(p.m, p.n, p.k, p.batch, mma_tuning(tuning));
    shape = {kTiles[tile].name, kTiles[tile].bm, kTiles[tile].bn};
  }
  static_assert(kSliceGranule == kGemmFp8Block, "fp8: a slice starts on a scale block");
  // Output tiles: rows of x (and y) by columns of y (output features).
  const int tile_rows = shape.rows, tile_cols = shape.cols;
  const int64_t tiles_n = ceil_div(p.n, tile_cols), tiles_m = ceil_div(p.m, tile_rows);
  if (int64_t(p.batch) * plan.splits > 65535 || tiles_n > 65535) {
    return cudaErrorInvalidValue;  // grid.z and grid.y limits
  }
  if (plan.splits > 1 && !scratch) return cudaErrorInvalidValue;

  TcParams t;
  t.x = reinterpret_cast<const uint16_t*>(x_bf16);
  t.w = reinterpret_cast<const uint16_t*>(p.w);
  t.w8 = p.w_fp8;
  t.w8_scale = p.w_scale;
  t.ld_w8_scale = p.ld_w_scale;
  t.y = p.y;
  t.counters = reinterpret_cast<unsigned*>(scratch);
  t.partial = scratch ? scratch + kSplitCounters : nullptr;
  t.m = p.m, t.n = p.n, t.k = p.k, t.batch = p.batch;
  t.splits = plan.splits, t.slice_k = plan.slice_k;
  t.ld_x = ld_xb, t.ld_w = p.ld_w, t.ld_y = p.ld_y;
  t.bs_x = bs_xb, t.bs_w = p.batch_stride_w, t.bs_y = p.batch_stride_y;
  t.alpha = p.alpha;
  t.nk = p.layout == WeightLayout::kNK;
  t.accumulate = p.output == GemmOutput::kAccumulate;
  // 16-byte cp.async needs every chunk address 16-byte aligned: the base, and row and batch
  // strides in multiples of 8 bf16 (chunk offsets within a row are multiples of 8 already).
  t.vec_x = aligned16(x_bf16) && ld_xb % 8 == 0 && (p.batch == 1 || bs_xb % 8 == 0);
  t.vec_w = fp8 ? aligned16(p.w_fp8) && p.ld_w % 16 == 0
                : aligned16(p.w) && p.ld_w % 8 == 0 && (p.batch == 1 || p.batch_stride_w % 8 == 0);
  // The fused reduction needs one counter per output tile; either way gives the same bits. By
  // default it runs for small tiles only: one CTA reducing a large tile waits on L2 round trips
  // that the separate kernel spreads over the whole GPU.
  t.fused = plan.splits > 1 && tuning.reduce != 0 &&
            (tuning.reduce == 1 || int64_t(tile_rows) * tile_cols <= kFusedReduceMaxTile) &&
            int64_t(p.batch) * tiles_m * tiles_n <= kSplitCounters;

  const cudaError_t err = wgmma_fp8 ? wgmma_fp8_launch(t, tile, stream)
                          : wgmma   ? wgmma_launch(t, tile, stream)
                                    : kTiles[tile].launch(t, stream);
  if (err != cudaSuccess || plan.splits == 1 || t.fused) return err;
  const int64_t total = int64_t(p.batch) * p.m * p.n;
  constexpr int kThreads = 256;
  reduce_splits_kernel<<<ceil_div(total, int64_t(kThreads)), kThreads, 0, stream>>>(t, total);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
