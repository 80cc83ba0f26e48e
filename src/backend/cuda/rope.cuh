// The rotation of one RoPE pair, as cpu/rope.cpp rounds it (each product rounded, no FMA), shared
// by rope.cu and the kernels that fuse a rope (indexer_key.cu).
#pragma once

#include <cuda_runtime.h>

namespace dsa::cuda {

// (a, b) <- (a c - b s, a s + b c)
__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
  const float x = a, y = b;
  a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}

}  // namespace dsa::cuda
