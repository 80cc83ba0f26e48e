// The batch-invariant tensor-core GEMM (GemmMode::kBatchInvariant, `--gemm invariant`):
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
//   1. K is cut into `splits` slices of `slice_k` (a multiple of kBK) columns. splits and
//      slice_k come from K, N and batch only (split_plan); never from m.
//   2. Within a slice, one warp owns the element and runs one chain of mma.sync over the
//      slice's k16 blocks in ascending order, starting from +0. The tile shape over m and n (the
//      three TileConfigs, picked by m) only decides WHICH warp runs the chain and where its
//      row sits in the 16-row fragment; the tensor core computes each D[i][j] from row i of A,
//      column j of B and C[i][j] alone, so the chain's bits do not depend on that. A k range
//      past the slice end is zero-filled (adds +0 products, identically for every m).
//   3. One slice: y = alpha * acc (or y + alpha * acc). Several: every slice writes its chain's
//      result to `partial`, and reduce_splits_kernel adds them in slice order 0, 1, ... in f32
//      (__fadd_rn), then applies alpha the same way.
// Rows of x at or beyond m are never read (zero-filled) and rows of y beyond m never written.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 fragments (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"); lane = 4 * g + t, g in [0, 8), t in [0, 4). A 32-bit
// register holds two bf16 with the lower k in its low half:
//   A (16 x 16, row-major, 4 regs): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
//                                   a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col-major", 2 regs): b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8 f32, 4 regs): c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// Shared memory: x as xs[row][k]; kNK weights as ws[col][k]; each row kRow = kBK + 8 bf16 (80 B:
// a multiple of 16 B for cp.async, and the 8 rows g of one fragment load fall in distinct banks:
// 20 g + t words mod 32 are all different). kKN weights stay n-contiguous, ws[k][col] with rows
// of kBN + 8 bf16, and a B register is two 16-bit loads a row apart (rows 2t and 2t + 1 land
// 8 t words apart mod 32: no conflicts either).
//
// Loads: 16-byte cp.async.cg (L2 only) when every address is 16-byte aligned (bases, row and
// batch strides multiples of 8 elements; slice and stage starts are multiples of kBK, tile
// columns multiples of 8), else element loads with zero fill, for any k, n and m. kStages-deep
// pipeline: the standard wait_group(kStages - 2) / __syncthreads / prefetch / compute loop.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace dsa::cuda {
namespace {

constexpr int kBK = 32;                     // k per pipeline stage
constexpr int kRow = kBK + 8;               // bf16 per shared-memory row (80 B)
constexpr int kSplitRefCols = 32;           // the column width split_plan counts CTAs with
constexpr int kSplitTargetCtas = 512;       // about four CTAs per SM of an H200 (132 SMs)
constexpr int kMinSliceK = 512;             // a slice is never shorter
constexpr int64_t kMaxPartialCols = 32768;  // splits * batch * n whenever splits > 1 (see below)

template <int kWarpsM_, int kWarpsN_, int kTilesM_, int kTilesN_, int kStages_>
struct TileConfig {
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;  // warps over m and n
  static constexpr int kTilesM = kTilesM_, kTilesN = kTilesN_;  // m16 and n8 tiles per warp
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBM = 16 * kTilesM * kWarpsM;
  static constexpr int kBN = 8 * kTilesN * kWarpsN;
  // x [kBM][kRow], then w as [kBN][kRow] (kNK) or [kBK][kBN + 8] (kKN), the larger of the two.
  static constexpr int kStageElems =
      kBM * kRow + (kBN * kRow > kBK * (kBN + 8) ? kBN * kRow : kBK * (kBN + 8));
  static constexpr int kSmemBytes = kStages * kStageElems * 2;
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory is limited to 48 KiB");
};
// m <= 16 (decode): 16 x 32 tiles, 4 warps side by side over n, a 6-deep weight stream.
using SmallM = TileConfig<1, 4, 1, 1, 6>;   // 23,040 B of shared memory
using MediumM = TileConfig<2, 4, 2, 2, 4>;  // m <= 64: 64 x 64 tiles, 40,960 B
using LargeM = TileConfig<4, 2, 2, 4, 3>;   // 128 x 64 tiles, 46,080 B

struct TcParams {
  const uint16_t* x;  // bf16 bits [batch][m, k]: row stride ld_x, batch stride bs_x
  const uint16_t* w;  // bf16 bits [batch][n, k] (nk) or [batch][k, n], row stride ld_w
  float* y;           // [batch][m, n], row stride ld_y, batch stride bs_y
  float* partial;     // [splits][batch][m][n] when splits > 1
  int m, n, k, batch, splits, slice_k;
  int64_t ld_x, ld_w, ld_y, bs_x, bs_w, bs_y;
  float alpha;
  bool nk, accumulate, vec_x, vec_w;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ uint32_t lds32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// d (+)= a * b on one m16n8k16 fragment triple (layouts in the header comment).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Rows [row0, row0 + kRows) x k [k0, k0 + kBK) of a k-contiguous bf16 matrix into dst[kRows][kRow].
// Rows >= row_end and k >= k_end become +0 and are never read.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_k_contiguous(uint16_t* dst, const uint16_t* src, int64_t ld,
                                                  int row0, int row_end, int k0, int k_end,
                                                  bool vec) {
  constexpr int kChunksPerRow = kBK / 8;  // 16-byte chunks
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
    uint16_t* d = dst + r * kRow + kc;  // 16-byte aligned: r * 80 B + kc * 2 B
    const int row = row0 + r, k = k0 + kc;
    const uint16_t* s = src + int64_t(row) * ld + k;
    if (vec && row < row_end && k + 8 <= k_end) {
      cp_async16(d, s);
    } else {
      uint16_t v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = row < row_end && k + i < k_end ? s[i] : uint16_t(0);
      uint4 packed;
      packed.x = uint32_t(v[0]) | uint32_t(v[1]) << 16;
      packed.y = uint32_t(v[2]) | uint32_t(v[3]) << 16;
      packed.z = uint32_t(v[4]) | uint32_t(v[5]) << 16;
      packed.w = uint32_t(v[6]) | uint32_t(v[7]) << 16;
      *reinterpret_cast<uint4*>(d) = packed;
    }
  }
}

// k [k0, k0 + kBK) x columns [n0, n0 + kCols) of a [k, n] bf16 matrix (kKN) into
// dst[kBK][kCols + 8], n-contiguous as in memory; the B fragments are gathered from it 16 bits at
// a time. Columns >= n_end and k >= k_end become +0 and are never read.
template <int kCols, int kThreads>
__device__ __forceinline__ void load_n_contiguous(uint16_t* dst, const uint16_t* src, int64_t ld,
                                                  int n0, int n_end, int k0, int k_end, bool vec) {
  constexpr int kChunksPerRow = kCols / 8, kRowN = kCols + 8;
  for (int c = threadIdx.x; c < kBK * kChunksPerRow; c += kThreads) {
    const int kk = c / kChunksPerRow, nc = (c % kChunksPerRow) * 8;
    uint16_t* d = dst + kk * kRowN + nc;  // 16-byte aligned: kRowN * 2 is 80 or 144 B
    const int k = k0 + kk, n = n0 + nc;
    const uint16_t* s = src + int64_t(k) * ld + n;
    if (vec && k < k_end && n + 8 <= n_end) {
      cp_async16(d, s);
    } else {
      uint16_t v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = k < k_end && n + i < n_end ? s[i] : uint16_t(0);
      uint4 packed;
      packed.x = uint32_t(v[0]) | uint32_t(v[1]) << 16;
      packed.y = uint32_t(v[2]) | uint32_t(v[3]) << 16;
      packed.z = uint32_t(v[4]) | uint32_t(v[5]) << 16;
      packed.w = uint32_t(v[6]) | uint32_t(v[7]) << 16;
      *reinterpret_cast<uint4*>(d) = packed;
    }
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads) gemm_tensor_kernel(TcParams p) {
  __shared__ __align__(16) uint16_t smem[C::kStages * C::kStageElems];
  const int b = int(blockIdx.z) % p.batch, s = int(blockIdx.z) / p.batch;
  const int m0 = int(blockIdx.y) * C::kBM, n0 = int(blockIdx.x) * C::kBN;
  const int k_begin = s * p.slice_k;
  const int k_end = min(p.k, k_begin + p.slice_k);
  const int tiles = (k_end - k_begin + kBK - 1) / kBK;
  const uint16_t* x = p.x + int64_t(b) * p.bs_x;
  const uint16_t* w = p.w + int64_t(b) * p.bs_w;

  auto load_stage = [&](int stage, int tile) {
    uint16_t* xs = smem + stage * C::kStageElems;
    uint16_t* ws = xs + C::kBM * kRow;
    const int k0 = k_begin + tile * kBK;
    load_k_contiguous<C::kBM, C::kThreads>(xs, x, p.ld_x, m0, p.m, k0, k_end, p.vec_x);
    if (p.nk) {
      load_k_contiguous<C::kBN, C::kThreads>(ws, w, p.ld_w, n0, p.n, k0, k_end, p.vec_w);
    } else {
      load_n_contiguous<C::kBN, C::kThreads>(ws, w, p.ld_w, n0, p.n, k0, k_end, p.vec_w);
    }
  };

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_m = (warp / C::kWarpsN) * C::kTilesM * 16;  // the warp's first row in the tile
  const int warp_n = (warp % C::kWarpsN) * C::kTilesN * 8;   // and its first column
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
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<C::kStages - 2>();  // groups 0..kt have landed (for this thread)
    __syncthreads();                  // ... for every thread; and stage (kt - 1) is consumed
    const int next = kt + C::kStages - 1;
    if (next < tiles) load_stage(next % C::kStages, next);
    cp_async_commit();

    const uint16_t* xs = smem + (kt % C::kStages) * C::kStageElems;
    const uint16_t* ws = xs + C::kBM * kRow;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t a[C::kTilesM][4], bw[C::kTilesN][2];
#pragma unroll
      for (int i = 0; i < C::kTilesM; ++i) {
        const uint16_t* r = xs + (warp_m + 16 * i + g) * kRow + kk + 2 * t;
        a[i][0] = lds32(r);
        a[i][1] = lds32(r + 8 * kRow);
        a[i][2] = lds32(r + 8);
        a[i][3] = lds32(r + 8 * kRow + 8);
      }
#pragma unroll
      for (int j = 0; j < C::kTilesN; ++j) {
        if (p.nk) {  // ws[n][k]: k pairs are adjacent
          const uint16_t* c = ws + (warp_n + 8 * j + g) * kRow + kk + 2 * t;
          bw[j][0] = lds32(c);
          bw[j][1] = lds32(c + 8);
        } else {  // ws[k][n]: k pairs are a row apart
          constexpr int kRowN = C::kBN + 8;
          const uint16_t* c = ws + (kk + 2 * t) * kRowN + warp_n + 8 * j + g;
          bw[j][0] = uint32_t(c[0]) | uint32_t(c[kRowN]) << 16;
          bw[j][1] = uint32_t(c[8 * kRowN]) | uint32_t(c[9 * kRowN]) << 16;
        }
      }
#pragma unroll
      for (int i = 0; i < C::kTilesM; ++i) {
#pragma unroll
        for (int j = 0; j < C::kTilesN; ++j) mma_bf16(acc[i][j], a[i], bw[j]);
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
        if (row >= p.m || col >= p.n) continue;
        if (p.splits == 1) {
          float* out = p.y + int64_t(b) * p.bs_y + int64_t(row) * p.ld_y + col;
          const float scaled = __fmul_rn(p.alpha, acc[i][j][r]);
          *out = p.accumulate ? __fadd_rn(*out, scaled) : scaled;
        } else {
          p.partial[((int64_t(s) * p.batch + b) * p.m + row) * p.n + col] = acc[i][j][r];
        }
      }
    }
  }
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

struct SplitPlan {
  int splits, slice_k;
};

// From K, N and batch only (never m), so every row of every batch size sums in the same order.
// Few output tiles (small n, one weight matrix) leave SMs idle at decode sizes, so K is cut
// until about kSplitTargetCtas CTAs of kSplitRefCols columns exist, but never into slices
// shorter than kMinSliceK. When splits > 1: batch * ceil(n / 32) = c < 512 and
// splits <= ceil(512 / c), so splits * batch * n <= (512 / c + 1) * 32 c < 32768 =
// kMaxPartialCols, which bounds the partial buffer at kMaxPartialCols floats per row of x.
SplitPlan split_plan(int n, int k, int batch) {
  const int64_t ctas = int64_t(batch) * ceil_div(n, kSplitRefCols);
  int splits = 1;
  if (ctas < kSplitTargetCtas) {
    splits = int(ceil_div(int64_t(kSplitTargetCtas), ctas));
    splits = std::min(splits, std::max(1, k / kMinSliceK));
  }
  const int slice_k = int(ceil_div(ceil_div(k, splits), kBK) * kBK);
  return {int(ceil_div(k, slice_k)), slice_k};
}

template <class C>
void launch_tiles(const TcParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(ceil_div(p.n, C::kBN)), unsigned(ceil_div(p.m, C::kBM)),
                  unsigned(p.batch * p.splits));
  gemm_tensor_kernel<C><<<grid, C::kThreads, 0, stream>>>(p);
}

}  // namespace

size_t gemm_invariant_partial_floats(const GemmParams& p) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.batch <= 0) return 0;
  const SplitPlan plan = split_plan(p.n, p.k, p.batch);
  return plan.splits == 1 ? 0 : size_t(plan.splits) * p.batch * p.m * p.n;
}

size_t gemm_invariant_partial_floats_bound(int max_rows) {
  return size_t(std::max(max_rows, 0)) * size_t(kMaxPartialCols);
}

cudaError_t gemm_invariant(const GemmParams& p, const Bf16* x_bf16, int64_t ld_xb, int64_t bs_xb,
                           float* partial, cudaStream_t stream) {
  const int64_t w_row = p.layout == WeightLayout::kNK ? p.k : p.n;
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.batch < 0 || ld_xb < p.k || p.ld_y < p.n ||
      p.ld_w < w_row) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0 || p.batch == 0) return cudaSuccess;
  if (!x_bf16 || !p.w || !p.y) return cudaErrorInvalidValue;
  const SplitPlan plan = split_plan(p.n, p.k, p.batch);
  if (int64_t(p.batch) * plan.splits > 65535 || ceil_div(p.m, 16) > 65535) {
    return cudaErrorInvalidValue;  // grid.z and grid.y limits
  }
  if (plan.splits > 1 && !partial) return cudaErrorInvalidValue;

  TcParams t;
  t.x = reinterpret_cast<const uint16_t*>(x_bf16);
  t.w = reinterpret_cast<const uint16_t*>(p.w);
  t.y = p.y;
  t.partial = partial;
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
  t.vec_w = aligned16(p.w) && p.ld_w % 8 == 0 && (p.batch == 1 || p.batch_stride_w % 8 == 0);

  if (p.m <= SmallM::kBM) {
    launch_tiles<SmallM>(t, stream);
  } else if (p.m <= MediumM::kBM) {
    launch_tiles<MediumM>(t, stream);
  } else {
    launch_tiles<LargeM>(t, stream);
  }
  if (plan.splits > 1) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t total = int64_t(p.batch) * p.m * p.n;
    constexpr int kThreads = 256;
    reduce_splits_kernel<<<unsigned(ceil_div(total, int64_t(kThreads))), kThreads, 0, stream>>>(
        t, total);
  }
  return cudaGetLastError();
}

}  // namespace dsa::cuda
