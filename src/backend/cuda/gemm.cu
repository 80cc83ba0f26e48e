// The batch-invariant GEMM: y_b[m, n] (+)= alpha * sum_k x_b[m, k] * w_b(n, k), in plain f32.
//
// Every output element is computed by one thread with exactly the sequence of cpu/gemm.cpp:
// acc = +0, then acc = acc + round(x * w) for k ascending (explicit __fmul_rn / __fadd_rn, so no
// FMA contraction), then y = alpha * acc or y + alpha * acc. The result is therefore bit-identical
// to the CPU reference, and a row's bits never depend on m or on the other rows (batch-invariant).
// x stays f32, as ops.h specifies; no tensor cores (they would round x to bf16 and reorder k).
//
// Tiling: a 64 x 64 output tile per block of 256 threads, each thread a strided 4 x 4 micro-tile;
// k in chunks of 16 through shared memory (w widened from bf16 on the way in).
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace dsa::cuda {
namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256, kMicro = 4;

__global__ void __launch_bounds__(kThreads) gemm_kernel(GemmParams p) {
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
      const int64_t at = nk ? int64_t(n0 + col) * p.ld_w + k0 + kk
                            : int64_t(k0 + kk) * p.ld_w + n0 + col;
      ws[kk][col] = in ? bf16_to_float(w[at]) : 0.0f;
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

}  // namespace

cudaError_t gemm_invariant(const GemmParams& p, cudaStream_t stream) {
  const int64_t w_row = p.layout == WeightLayout::kNK ? p.k : p.n;
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.batch < 0 || p.ld_x < p.k || p.ld_y < p.n ||
      p.ld_w < w_row || p.batch > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0 || p.batch == 0) return cudaSuccess;
  if (!p.x || !p.w || !p.y) return cudaErrorInvalidValue;
  const dim3 grid(ceil_div(p.n, kTileN), ceil_div(p.m, kTileM), unsigned(p.batch));
  gemm_kernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
