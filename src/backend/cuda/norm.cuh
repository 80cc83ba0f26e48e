// The row statistics of RMSNorm and LayerNorm, shared by norm.cu and the kernels that fuse a norm
// (indexer_key.cu), so a fused norm gives the standalone op's bits.
//
// The order of every sum is fixed by dim alone: a row of dim <= kWarpRowMaxDim is reduced by one
// warp, a longer one by a group of kBlockThreads threads. Thread t of the group owns the groups of
// 4 columns 4 (t + j G), j = 0, 1, ... (G the group's size), adds their terms in that order and in
// column order within a group, and the group then sums its threads by warp butterflies (and, for
// a block, warp 0 over the warps' partials in warp order). The row count, the row's place in the
// batch and the number of CTAs that write the row never enter it: batch-invariant.
#pragma once

#include "backend/cuda/common.cuh"

namespace dsa::cuda {

inline constexpr int kWarpRowMaxDim = 1024;  // up to 8 groups of 4 columns per lane
inline constexpr int kBlockThreads = 256;    // the group that reduces a longer row

// Columns c0 .. c0 + 3 of a row (those below dim), as a vector when `vec` (the row is 16-byte
// aligned and dim % 4 == 0), else element by element; missing columns read as 0 and are never used.
__device__ __forceinline__ float4 norm_load4(const float* row, int c0, int dim, bool vec) {
  if (vec) return *reinterpret_cast<const float4*>(row + c0);
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (c0 < dim) v.x = row[c0];
  if (c0 + 1 < dim) v.y = row[c0 + 1];
  if (c0 + 2 < dim) v.z = row[c0 + 2];
  if (c0 + 3 < dim) v.w = row[c0 + 3];
  return v;
}

// Adds f(x_j) for the valid columns of one group, in column order.
template <typename F>
__device__ __forceinline__ float norm_add_group(float sum, float4 v, int c0, int dim, F f) {
  const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (c0 + j < dim) sum = __fadd_rn(sum, f(e[j]));
  }
  return sum;
}

// This thread's share of sum f(x_c) over a row, `t` its index in a group of `threads`.
template <typename F>
__device__ __forceinline__ float norm_thread_sum(const float* row, int dim, bool vec, int t,
                                                 int threads, F f) {
  // Four groups' loads are issued before their terms are added (in the same order), so they
  // are in flight together.
  constexpr int kBatch = 4;
  float sum = 0.0f;
  for (int c = 4 * t; c < dim; c += kBatch * 4 * threads) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c0 = c + u * 4 * threads;
      if (c0 < dim) v[u] = norm_load4(row, c0, dim, vec);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c0 = c + u * 4 * threads;
      if (c0 < dim) sum = norm_add_group(sum, v[u], c0, dim, f);
    }
  }
  return sum;
}

// 1 / sqrt(mean_square + eps) and the RMSNorm of one element, as cpu/norm.cpp rounds them.
__device__ __forceinline__ float rms_inverse(float sum_squares, int dim, float eps) {
  const float mean_square = __fdiv_rn(sum_squares, float(dim));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_square, eps)));
}
__device__ __forceinline__ float rms_value(float x, float inv_rms, float w) {
  return __fmul_rn(__fmul_rn(x, inv_rms), w);
}

// ((x - mean) * inv_std) * w (+ b): the LayerNorm of one element, as cpu/norm.cpp rounds it.
__device__ __forceinline__ float layernorm_value(float x, float mean, float inv_std, float w,
                                                 const Bf16* bias, int c) {
  const float normed = __fmul_rn(__fmul_rn(__fsub_rn(x, mean), inv_std), w);
  return bias ? __fadd_rn(normed, bf16_to_float(bias[c])) : normed;
}
__device__ __forceinline__ float layernorm_inverse(float sum_squares, int dim, float eps) {
  const float variance = __fdiv_rn(sum_squares, float(dim));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, eps)));
}

}  // namespace dsa::cuda
