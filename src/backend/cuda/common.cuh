// Small device helpers shared by the CUDA kernels: warp and block reductions, 16-byte loads and
// stores, and bf16 / fp8 packing through the conversions of dsa/dtype.h (the very functions the
// CPU reference calls, so packed bytes are identical to the CPU's).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsa/dtype.h"

namespace dsa::cuda {

inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The mask of the aligned group of `width` lanes (a power of two <= 32) that holds `lane`.
__device__ __forceinline__ unsigned group_mask(int lane, int width) {
  if (width == 32) return kFullMask;
  return ((1u << width) - 1u) << (lane & ~(width - 1));
}

// Max over an aligned group of `kWidth` lanes; every lane of the group must take part. The
// comparison is the one of encode_fp8_group (a NaN never wins), and max does not depend on order.
template <int kWidth>
__device__ __forceinline__ float group_max(float v, unsigned mask) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(mask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over the warp, in a fixed butterfly order: the same bits for the same inputs, every run.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Block-wide sum or max in a fixed order (warp butterflies, then warp 0 over the partials). Every
// thread of the block must call it; `scratch` holds >= 32 floats. The result goes to all threads.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
    w = kMax ? warp_max(w) : warp_sum(w);
    if (lane == 0) scratch[0] = w;
  }
  __syncthreads();
  return scratch[0];
}

// ---- loads and stores ----

// n floats from p (n a multiple of 4): 16-byte loads when `aligned`, else scalar ones. The values
// are read once, so they are loaded with the streaming hint.
template <int kN>
__device__ __forceinline__ void load_floats(const float* p, bool aligned, float (&out)[kN]) {
  static_assert(kN % 4 == 0);
  if (aligned) {
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) {
      const float4 v = __ldcs(reinterpret_cast<const float4*>(p) + i);
      out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = p[i];
  }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(float_to_bf16(lo).bits) | (uint32_t(float_to_bf16(hi).bits) << 16);
}
// Four fp8 codes of x[i] / scale (the division of encode_fp8_group), low byte first.
__device__ __forceinline__ uint32_t pack_fp8x4(const float* x, float scale) {
  uint32_t v = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) v |= uint32_t(float_to_fp8(__fdiv_rn(x[i], scale)).bits) << (8 * i);
  return v;
}

// |x| max of n local values, as encode_fp8_group computes it.
template <int kN>
__device__ __forceinline__ float local_amax(const float (&x)[kN]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  return amax;
}

__device__ __forceinline__ void store16(void* dst, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(a, b, c, d);
}
__device__ __forceinline__ void store8(void* dst, uint32_t a, uint32_t b) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(a, b);
}

// ---- the cluster barrier (every thread of every CTA of the cluster, in the same order) ----

// Its halves: arrive (relaxed: nothing to publish; release: this thread's writes, shared memory
// included, are visible to whoever waits after it), then wait (plain, or acquire: the others'
// released writes are visible here). The instructions are .aligned: a warp's lanes run them
// together.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The whole barrier: release, then acquire.
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive_release();
  cluster_wait_acquire();
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

}  // namespace dsa::cuda
