// The fp8-weight side of the invariant mma.sync GEMM (gemm_tensor.cu, its header comment has the
// design): the weight tile's loads as fp8 bytes and their dequantization into bf16 fragments,
// bit for bit dsa::dequant_fp8_weight.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/mma.cuh"

namespace dsa::cuda {

// 16 fp8 bytes from s into the 16-byte-aligned d: cp.async when all are in range and aligned, else
// byte loads with zero fill (nothing is read for an out-of-range byte).
__device__ __forceinline__ void load_chunk_fp8(uint8_t* d, const uint8_t* s, bool row_ok, int avail,
                                               bool vec) {
  if (!row_ok || avail <= 0) {
    *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  } else if (vec && avail >= 16) {
    cp_async16(d, s);
  } else {
    uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (i < avail) words[i / 4] |= uint32_t(s[i]) << (8 * (i % 4));
    }
    *reinterpret_cast<uint4*>(d) = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// Rows [n0, n0 + kBN) x k [k0, k0 + kBK) of the [n, k] fp8 weights into dst[kBN][kRowQ] bytes.
// Rows >= n_end and k >= k_end become 0 (+0 once dequantized by a finite scale).
template <class C>
__device__ __forceinline__ void load_fp8_rows(uint8_t* dst, const uint8_t* src, int64_t ld, int n0,
                                              int n_end, int k0, int k_end, bool vec) {
  constexpr int kChunksPerRow = C::kBK / 16;
#pragma unroll 4
  for (int c = threadIdx.x; c < C::kBN * kChunksPerRow; c += C::kThreads) {
    const int r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 16;
    const int row = n0 + r, k = k0 + kc;
    load_chunk_fp8(dst + r * C::kRowQ + kc, src + int64_t(row) * ld + k, row < n_end, k_end - k,
                   vec);
  }
}

// Two adjacent fp8 weights (the lower k in the low byte) dequantized by one scale into a bf16x2
// register (the lower k in the low half): dsa::dequant_fp8_weight of each, bit for bit. e4m3 ->
// f16 is exact (every e4m3 value is an f16, subnormals included), f16 -> f32 too; then the f32
// product (nearest even) and cvt.rn.bf16x2.f32 (nearest even, a NaN becomes the canonical
// 0x7FFF as in float_to_bf16).
__device__ __forceinline__ uint32_t dequant_fp8x2(uint16_t q2, float scale) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(q2));
  const float lo = __half2float(__ushort_as_half(uint16_t(h2 & 0xFFFFu)));
  const float hi = __half2float(__ushort_as_half(uint16_t(h2 >> 16)));
  uint32_t out;  // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half, b in the lower
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n"
      : "=r"(out)
      : "f"(__fmul_rn(hi, scale)), "f"(__fmul_rn(lo, scale)));
  return out;
}

}  // namespace dsa::cuda
