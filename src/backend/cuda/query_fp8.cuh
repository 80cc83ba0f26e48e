// The fp8 encoding of one 128-dim indexer query head, shared by the op that produces the query
// (indexer_query, indexer_key.cu) and the fp8 indexer kernels that encode it themselves
// (indexer_common.cuh's encode_head): one warp per head, lane holding dims [4 lane, 4 lane + 4).
// The CPU's encoder, bit for bit (encode_fp8_group in dsa/token_codec.h): amax over the head with
// NaN never winning, s_q = fp8_scale_for_amax(amax) with exact rounding, each dim e4m3(x / s_q).
#pragma once

#include <cstdint>

#include "dsa/dtype.h"

namespace dsa::cuda {

// float_to_fp8(x).bits with the conversion unit: round to nearest even, saturated to +-448 (the
// infinities too), the sign of zero kept, NaN 0x7f.
__device__ __forceinline__ uint32_t e4m3_bits(float x) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(0.0f), "f"(x));
  return x != x ? 0x7fu : uint32_t(pair & 0xff);
}

// Warp-collective: every lane of the warp calls it with its 4 dims of the same head. Returns s_q;
// `bytes` gets this lane's 4 e4m3 bytes (byte j = dim 4 lane + j). kFastCvt: e4m3_bits (a few
// instructions) instead of float_to_fp8's integer code (a few dozen); the same bits.
template <bool kFastCvt>
__device__ __forceinline__ float encode_fp8_head(const float (&x)[4], uint32_t& bytes) {
  float amax = 0.0f;
  for (int j = 0; j < 4; ++j) {
    const float a = x[j] < 0 ? -x[j] : x[j];
    amax = a > amax ? a : amax;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, amax, o);
    amax = other > amax ? other : amax;
  }
  const float s_q = fp8_scale_for_amax(amax, ScaleRounding::kExact);
  bytes = 0;
  for (int j = 0; j < 4; ++j) {
    const float scaled = x[j] / s_q;
    bytes |= (kFastCvt ? e4m3_bits(scaled) : uint32_t(float_to_fp8(scaled).bits)) << (8 * j);
  }
  return s_q;
}

}  // namespace dsa::cuda
