// The exact GEMM (GemmMode::kExact, `--gemm exact`):
// y_b[m, n] (+)= alpha * sum_k x_b[m, k] * w_b(n, k), in plain f32. gemm_tensor.cu is the fast
// batch-invariant one (bf16 x, tensor cores); this one is kept for bitwise CPU comparisons.
//
// Every output element is computed by one thread with exactly the sequence of cpu/gemm.cpp:
// acc = +0, then acc = acc + round(x * w) for k ascending (explicit __fmul_rn / __fadd_rn, so no
// FMA contraction), then y = alpha * acc or y + alpha * acc. The result is therefore bit-identical
// to the CPU reference, and a row's bits never depend on m or on the other rows (batch-invariant).
// x stays f32, as ops.h specifies; no tensor cores (they would round x to bf16 and reorder k).
// fp8 weights (kNK, batch 1) are dequantized per element by dsa::dequant_fp8_weight, the CPU's
// function, on their way into shared memory or registers (weight_value), so the bits still match.
//
// Two kernels, chosen by m, compute exactly that sequence, so the choice never shows in the bits:
//   - small m (decode): a block owns 32 columns and 8 rows. All 256 threads stream the w tile of
//     the next k chunk (256 wide) into registers while each thread runs the sequential sum of one
//     (row, column) over the current chunk from shared memory. A row's sums are chains of k
//     dependent adds, so parallelism comes from columns and rows, and w is read once per 8 rows.
//   - larger m: a 64 x 64 output tile per block of 256 threads, each thread a strided 4 x 4
//     micro-tile; k in chunks of 16 through shared memory (w widened from bf16 on the way in).
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"

namespace dsa::cuda {
namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256, kMicro = 4;

// The weight w(n, k) at element offset `at` as f32: widened from bf16, or dequantized from fp8 by
// its block's scale (ops.h; p.w_fp8 is kNK and batch 1, so at = n * ld_w + k).
__device__ __forceinline__ float weight_value(const GemmParams& p, const Bf16* w, int64_t at, int n,
                                              int k) {
  if (p.w_fp8 == nullptr) return bf16_to_float(w[at]);
  const float scale = p.w_scale[int64_t(n / kGemmFp8Block) * p.ld_w_scale + k / kGemmFp8Block];
  return bf16_to_float(dequant_fp8_weight(Fp8E4M3{p.w_fp8[at]}, scale));
}

__global__ void __launch_bounds__(kThreads) gemm_kernel(GemmParams p) {
  pdl_enter();
  __shared__ float xs[kTileK][kTileM];
  __shared__ float ws[kTileK][kTileN];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int m0 = blockIdx.y * kTileM, n0 = blockIdx.x * kTileN;
  const float* x = p.x + blockIdx.z * p.batch_stride_x;
  const Bf16* w = p.w + blockIdx.z * p.batch_stride_w;
  float* y = p.y + blockIdx.z * p.batch_stride_y;
  const bool nk = p.layout == WeightLayout::kNK;

  float acc[kMicro][kMicro];
#pragma unroll
  for (int i = 0; i < kMicro; ++i) {
#pragma unroll
    for (int j = 0; j < kMicro; ++j) acc[i][j] = 0.0f;
  }
  for (int k0 = 0; k0 < p.k; k0 += kTileK) {
#pragma unroll
    for (int l = 0; l < kTileM * kTileK / kThreads; ++l) {
      const int e = tid + l * kThreads;
      const int row = e / kTileK, kk = e % kTileK;
      const bool in = m0 + row < p.m && k0 + kk < p.k;
      xs[kk][row] = in ? x[int64_t(m0 + row) * p.ld_x + k0 + kk] : 0.0f;
    }
#pragma unroll
    for (int l = 0; l < kTileN * kTileK / kThreads; ++l) {
      const int e = tid + l * kThreads;
      const int col = nk ? e / kTileK : e % kTileN, kk = nk ? e % kTileK : e / kTileN;
      const bool in = n0 + col < p.n && k0 + kk < p.k;
      const int64_t at =
          nk ? int64_t(n0 + col) * p.ld_w + k0 + kk : int64_t(k0 + kk) * p.ld_w + n0 + col;
      ws[kk][col] = in ? weight_value(p, w, at, n0 + col, k0 + kk) : 0.0f;
    }
    __syncthreads();
    const int k_end = p.k - k0 < kTileK ? p.k - k0 : kTileK;  // padding is never added
    for (int kk = 0; kk < k_end; ++kk) {
      float a[kMicro], b[kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i) a[i] = xs[kk][ty + 16 * i], b[i] = ws[kk][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
#pragma unroll
        for (int j = 0; j < kMicro; ++j) acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(a[i], b[j]));
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kMicro; ++i) {
    const int row = m0 + ty + 16 * i;
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int col = n0 + tx + 16 * j;
      if (col >= p.n) continue;
      float* out = y + int64_t(row) * p.ld_y + col;
      const float scaled = __fmul_rn(p.alpha, acc[i][j]);
      *out = p.output == GemmOutput::kOverwrite ? scaled : __fadd_rn(*out, scaled);
    }
  }
}

// ---- small m ----

constexpr int kSmallRows = 8, kSmallCols = 32, kChunk = 256, kSmallMaxM = 32;

// The next chunk, staged in registers while the current one is summed: thread t holds 32 values
// of w and 8 of x. w, kNK: column t / 8, k (t % 8) * 32 .. + 31; kKN: k t, columns 0 .. 31 (each
// 64 contiguous bytes). x: row t / 32, k (t % 32) * 8 .. + 7. Out-of-range values are 0 and are
// never added (the sums stop at k).
struct SmallChunk {
  float w[32];
  float x[8];
};

// `vec`: w and x rows are 16-byte aligned (checked on the host), so whole in-range runs load as
// 16-byte vectors.
__device__ __forceinline__ void load_small_chunk(const GemmParams& p, const float* x, const Bf16* w,
                                                 int m0, int n0, int k0, bool vec, SmallChunk& c) {
  const int t = threadIdx.x;
  const bool nk = p.layout == WeightLayout::kNK;
  const int col0 = nk ? t / 8 : 0, kk0 = nk ? (t % 8) * 32 : t;  // the run's first value
  const int64_t at0 = nk ? int64_t(n0 + col0) * p.ld_w + k0 + kk0 : int64_t(k0 + kk0) * p.ld_w + n0;
  const bool whole = nk ? n0 + col0 < p.n && k0 + kk0 + 31 < p.k : k0 + kk0 < p.k && n0 + 31 < p.n;
  if (vec && whole && p.w_fp8 == nullptr) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 u = *reinterpret_cast<const uint4*>(w + at0 + 8 * v);
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        c.w[8 * v + 2 * j] = bf16_to_float(Bf16{uint16_t(words[j] & 0xFFFFu)});
        c.w[8 * v + 2 * j + 1] = bf16_to_float(Bf16{uint16_t(words[j] >> 16)});
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = nk ? col0 : i, kk = nk ? kk0 + i : kk0;
      const bool in = n0 + col < p.n && k0 + kk < p.k;
      c.w[i] = in ? weight_value(p, w, at0 + i, n0 + col, k0 + kk) : 0.0f;
    }
  }
  const int row = t / 32, xk = (t % 32) * 8;
  const float* xr = x + int64_t(m0 + row) * p.ld_x + k0 + xk;
  const bool row_in = m0 + row < p.m;
  if (vec && row_in && k0 + xk + 7 < p.k) {
    const float4 a = *reinterpret_cast<const float4*>(xr);
    const float4 b = *reinterpret_cast<const float4*>(xr + 4);
    c.x[0] = a.x, c.x[1] = a.y, c.x[2] = a.z, c.x[3] = a.w;
    c.x[4] = b.x, c.x[5] = b.y, c.x[6] = b.z, c.x[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) c.x[i] = row_in && k0 + xk + i < p.k ? xr[i] : 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads) gemm_small_m_kernel(GemmParams p, bool vec) {
  pdl_enter();
  __shared__ float ws[kSmallCols][kChunk + 1];  // +1: a warp's 32 columns fall in 32 banks
  __shared__ float xs[kSmallRows][kChunk];
  const int t = threadIdx.x, col = t % 32, row = t / 32;
  const int m0 = blockIdx.y * kSmallRows, n0 = blockIdx.x * kSmallCols;
  const float* x = p.x + blockIdx.z * p.batch_stride_x;
  const Bf16* w = p.w + blockIdx.z * p.batch_stride_w;
  float* y = p.y + blockIdx.z * p.batch_stride_y;
  const bool nk = p.layout == WeightLayout::kNK;

  SmallChunk next;
  load_small_chunk(p, x, w, m0, n0, 0, vec, next);
  float acc = 0.0f;
  for (int k0 = 0; k0 < p.k; k0 += kChunk) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      if (nk) {
        ws[t / 8][(t % 8) * 32 + i] = next.w[i];
      } else {
        ws[i][t] = next.w[i];
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) xs[t / 32][(t % 32) * 8 + i] = next.x[i];
    __syncthreads();
    if (k0 + kChunk < p.k) load_small_chunk(p, x, w, m0, n0, k0 + kChunk, vec, next);
    const int k_end = p.k - k0 < kChunk ? p.k - k0 : kChunk;  // padding is never added
    for (int kk = 0; kk < k_end; ++kk) acc = __fadd_rn(acc, __fmul_rn(xs[row][kk], ws[col][kk]));
    __syncthreads();
  }
  if (m0 + row >= p.m || n0 + col >= p.n) return;
  float* out = y + int64_t(m0 + row) * p.ld_y + n0 + col;
  const float scaled = __fmul_rn(p.alpha, acc);
  *out = p.output == GemmOutput::kOverwrite ? scaled : __fadd_rn(*out, scaled);
}

}  // namespace

cudaError_t gemm_exact(const GemmParams& p, cudaStream_t stream) {
  const int64_t w_row = p.layout == WeightLayout::kNK ? p.k : p.n;
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.batch < 0 || p.ld_x < p.k || p.ld_y < p.n ||
      p.ld_w < w_row || p.batch > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0 || p.batch == 0) return cudaSuccess;
  if (!p.x || (p.w == nullptr) == (p.w_fp8 == nullptr) || !p.y) return cudaErrorInvalidValue;
  if (p.w_fp8 && (!p.w_scale || p.layout != WeightLayout::kNK || p.batch != 1)) {
    return cudaErrorInvalidValue;
  }
  if (p.m <= kSmallMaxM) {
    const dim3 grid(ceil_div(p.n, kSmallCols), ceil_div(p.m, kSmallRows), unsigned(p.batch));
    // Every run starts 16-byte aligned when the bases are and every stride is a multiple of 16 B
    // (k0 and the runs' offsets are multiples of 8 elements).
    const bool vec = aligned16(p.w) && aligned16(p.x) && p.ld_w % 8 == 0 &&
                     p.batch_stride_w % 8 == 0 && p.ld_x % 4 == 0 && p.batch_stride_x % 4 == 0;
    launch_kernel(gemm_small_m_kernel, grid, kThreads, 0, stream, p, vec);
    return cudaGetLastError();
  }
  const dim3 grid(ceil_div(p.n, kTileN), ceil_div(p.m, kTileM), unsigned(p.batch));
  launch_kernel(gemm_kernel, grid, kThreads, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
