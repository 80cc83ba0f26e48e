// The Walsh-Hadamard butterflies of one row held by a warp, shared by hadamard.cu and the kernels
// that fuse a Hadamard rotation (indexer_key.cu). Lane l holds elements kPer l .. kPer l + kPer - 1
// of a row of 32 kPer. Spans 1, 2, ... run in increasing order, within a lane and then across
// lanes by shuffles, each pair (a, b) -> (a + b, a - b): the additions of cpu/hadamard.cpp, so the
// bits are the CPU's. Every lane of the warp must call it.
#pragma once

#include "backend/cuda/common.cuh"

namespace dsa::cuda {

template <int kPer>
__device__ __forceinline__ void warp_hadamard(float (&v)[kPer], int lane) {
#pragma unroll
  for (int span = 1; span < kPer; span *= 2) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (i & span) continue;
      const float a = v[i], b = v[i + span];
      v[i] = __fadd_rn(a, b);
      v[i + span] = __fsub_rn(a, b);
    }
  }
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {  // span m * kPer: the partner is lane ^ m
    const bool upper = lane & m;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const float other = __shfl_xor_sync(kFullMask, v[i], m);
      v[i] = upper ? __fsub_rn(other, v[i]) : __fadd_rn(v[i], other);
    }
  }
}

}  // namespace dsa::cuda
