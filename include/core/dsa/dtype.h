// Scalar types of dsa.cpp and their conversions.
//
// Every conversion here is the single definition used by both backends: the CPU reference calls
// these functions, and the CUDA kernels call the very same inline code, so a store is byte-exact
// across backends by construction.
//   bf16:     round to nearest even; NaN becomes the canonical quiet NaN 0x7FFF.
//   fp8 e4m3: OCP e4m3fn (bias 7, no infinities, max 448). Round to nearest even, saturate to
//             +-448 (infinities too), NaN becomes 0x7F: the `cvt.rn.satfinite.e4m3x2.f32` result.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
#endif

namespace dsa {

enum class DType : uint8_t { kF32, kBf16, kFp8E4M3, kI32, kI64, kU8 };

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBf16:
      return 2;
    case DType::kFp8E4M3:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBf16:
      return "bf16";
    case DType::kFp8E4M3:
      return "fp8_e4m3";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

// Storage types: plain bits, so that host and device code agree on layout.
struct Bf16 {
  uint16_t bits;
};
struct Fp8E4M3 {
  uint8_t bits;
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp8E4M3) == 1);

inline constexpr float kFp8Max = 448.0f;

DSA_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DSA_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

DSA_HD bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

DSA_HD float bf16_to_float(Bf16 b) { return bits_float(uint32_t(b.bits) << 16); }

DSA_HD Bf16 float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if (is_nan_bits(u)) return Bf16{0x7FFF};
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return Bf16{uint16_t(rounded >> 16)};
}

// Rounds f to the nearest bf16 value and returns it as float.
DSA_HD float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

DSA_HD float fp8_to_float(Fp8E4M3 v) {
  const uint32_t sign = uint32_t(v.bits & 0x80u) << 24;
  const uint32_t exp = (v.bits >> 3) & 0xFu;
  const uint32_t man = v.bits & 0x7u;
  if (exp == 0xF && man == 0x7) return bits_float(0x7FC00000u | sign);  // NaN
  if (exp == 0) {
    // Subnormal: man * 2^-9, exact in f32.
    const float mag = float(man) * (1.0f / 512.0f);
    return bits_float(float_bits(mag) | sign);
  }
  // Normal: rebias 7 -> 127 and widen the 3-bit mantissa.
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// A block-scaled fp8 weight element (DeepSeek's `weight_scale_inv`: one f32 scale per 128 x 128
// block of a [n, k] matrix) has the value bf16(fp8 * scale): the product taken in f32 (nearest
// even), then rounded to bf16 (nearest even). This is the one definition: the checkpoint loader's
// dequantization, the CPU GEMM on fp8 weights and the CUDA GEMM's conversion (which computes the
// same bits with the hardware converts, gemm_tensor.cu) all agree with it, so an fp8-weight GEMM
// is the bf16 GEMM on the dequantized matrix, bit for bit.
DSA_HD Bf16 dequant_fp8_weight(Fp8E4M3 q, float scale) {
#if defined(__CUDA_ARCH__)
  return float_to_bf16(__fmul_rn(fp8_to_float(q), scale));
#else
  return float_to_bf16(fp8_to_float(q) * scale);
#endif
}

DSA_HD Fp8E4M3 float_to_fp8(float f) {
  const uint32_t u = float_bits(f);
  if (is_nan_bits(u)) return Fp8E4M3{0x7F};
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t code;
  if (a < 0x3C800000u) {  // |f| < 2^-6: fp8 subnormal range (or zero)
    // |f| * 2^9 is exact; round half to even to an integer in [0, 8]. 8 is the smallest normal.
    const uint32_t exp = a >> 23;
    if (exp < 117) {  // |f| < 2^-10, below half the smallest subnormal: rounds to zero
      code = 0;
    } else {
      // Mantissa with implicit one, as a fixed-point number scaled by 2^(exp-127-23+9).
      const uint32_t man = (a & 0x7FFFFFu) | 0x800000u;
      const uint32_t shift = 23 - 9 + 127 - exp;  // in [14, 24]
      const uint32_t q = man >> shift;
      const uint32_t rem = man & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1);
      code = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    }
  } else {
    const uint32_t exp = (a >> 23) - 127 + 7;  // >= 1 here
    const uint32_t man = a & 0x7FFFFFu;
    uint32_t m3 = man >> 20;
    const uint32_t rem = man & 0xFFFFFu;
    uint32_t e = exp;
    if (rem > 0x80000u || (rem == 0x80000u && (m3 & 1u))) {
      if (++m3 == 8) {
        m3 = 0;
        ++e;
      }
    }
    code = e > 15 ? 0x7Fu : ((e << 3) | m3);
    if (code > 0x7Eu) code = 0x7Eu;  // saturate: 448 (infinities and overflow too)
  }
  return Fp8E4M3{uint8_t(sign | code)};
}

// The per-token (or per-tile) fp8 scale of DESIGN §3: max(amax, 1e-4) / 448, optionally rounded
// up to a power of two (ue8m0).
enum class ScaleRounding : uint8_t { kExact, kUe8m0 };

DSA_HD float fp8_scale_for_amax(float amax, ScaleRounding rounding) {
  const float s = (amax > 1e-4f ? amax : 1e-4f) / kFp8Max;
  if (rounding == ScaleRounding::kExact) return s;
  // Round up to a power of two: clear the mantissa, and bump the exponent if any bit was set.
  const uint32_t u = float_bits(s);
  const uint32_t pow2 = u & 0x7F800000u;
  return bits_float((u & 0x7FFFFFu) ? pow2 + 0x800000u : pow2);
}

}  // namespace dsa
