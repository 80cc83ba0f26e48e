// The scalar conversions of dtype.h against independent references built from float64 arithmetic
// (frexp/ldexp and brute-force searches), not from bit tricks like the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/test_util.h"
#include "dsa/dtype.h"

namespace dsa {
namespace {

using testing::Rng;

// ---- bf16 --------------------------------------------------------------------------------------

// bf16 has 8 significant bits, the exponent range of f32 and subnormals down to 2^-133.
// Rounds |f| to a multiple of its bf16 quantum, ties to the even multiple, in float64, and
// returns the bits. NaN gives the canonical 0x7FFF.
uint16_t reference_bf16(float f) {
  if (std::isnan(f)) return 0x7FFF;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double mag = std::fabs(double(f));
  if (std::isinf(mag)) return sign | 0x7F80;
  int exp = 0;
  std::frexp(mag, &exp);  // mag = frac * 2^exp, frac in [0.5, 1)
  const double quantum = std::ldexp(1.0, std::max(exp, -125) - 8);
  const double lo = std::floor(mag / quantum);
  const double rem = mag / quantum - lo;  // exact: mag/quantum has at most 24 significant bits
  double q = lo;
  if (rem > 0.5 || (rem == 0.5 && std::fmod(lo, 2.0) == 1.0)) q = lo + 1;
  const double rounded = q * quantum;
  if (rounded >= std::ldexp(1.0, 128)) return sign | 0x7F80;  // rounds past the largest: inf
  const float as_float = float(rounded);                      // exact
  uint32_t bits = 0;
  std::memcpy(&bits, &as_float, 4);
  EXPECT_EQ(bits & 0xFFFFu, 0u) << "reference produced a non-bf16 value for " << f;
  return uint16_t(sign | (bits >> 16));
}

TEST(DtypeBf16, EdgeCases) {
  struct Case {
    uint32_t input;
    uint16_t expected;
  };
  const Case cases[] = {
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // signed zeros keep their sign
      {0x3F800000u, 0x3F80},                         // 1.0 exact
      {0x3F808000u, 0x3F80}, {0x3F818000u, 0x3F82},  // ties: to the even mantissa
      {0x3F808001u, 0x3F81}, {0x3F807FFFu, 0x3F80},  // just above / below a tie
      {0xBF818000u, 0xBF82},                         // negative tie, odd -> up in magnitude
      {0x3FFF8000u, 0x4000},                         // mantissa carry into the exponent
      {0x7F7F7FFFu, 0x7F7F},                         // below the overflow tie
      {0x7F7F8000u, 0x7F80}, {0x7F7FFFFFu, 0x7F80},  // overflow tie and above: inf
      {0xFF7FFFFFu, 0xFF80},                         //   and -inf
      {0x7F800000u, 0x7F80}, {0xFF800000u, 0xFF80},  // infinities stay
      {0x7FC00000u, 0x7FFF}, {0xFFC00000u, 0x7FFF},  // NaNs: canonical, sign dropped
      {0x7F800001u, 0x7FFF}, {0x7FFFFFFFu, 0x7FFF},  // signalling / all-ones payload NaNs
      {0x00000001u, 0x0000}, {0x00008000u, 0x0000},  // denormals: below and at the first tie
      {0x00008001u, 0x0001}, {0x00018000u, 0x0002},  // above a tie; odd tie goes up
      {0x0000FFFFu, 0x0001}, {0x007FFFFFu, 0x0080},  // largest denormal rounds to the min normal
      {0x80018000u, 0x8002},
  };
  for (const Case& c : cases) {
    const float f = bits_float(c.input);
    EXPECT_EQ(float_to_bf16(f).bits, c.expected) << std::hex << "input 0x" << c.input;
    EXPECT_EQ(reference_bf16(f), c.expected) << std::hex << "reference, input 0x" << c.input;
  }
}

TEST(DtypeBf16, MatchesFloat64ReferenceOnRandomFloats) {
  Rng rng(101);
  for (int i = 0; i < 2'000'000; ++i) {
    // Half uniform bit patterns (every exponent, denormals, inf, NaN), half normal values.
    const float f = (i & 1) ? bits_float(uint32_t(rng.gen()())) : rng.normal(3.0f);
    const uint16_t got = float_to_bf16(f).bits;
    const uint16_t want = reference_bf16(f);
    if (got != want) {
      ADD_FAILURE() << std::hex << "float bits 0x" << float_bits(f) << ": got 0x" << got
                    << ", want 0x" << want;
      break;
    }
  }
}

TEST(DtypeBf16, EveryCodeRoundTrips) {
  for (uint32_t code = 0; code < 0x10000u; ++code) {
    const Bf16 b{uint16_t(code)};
    const float f = bf16_to_float(b);
    EXPECT_EQ(float_bits(f), code << 16);
    const uint16_t back = float_to_bf16(f).bits;
    const bool nan = (code & 0x7F80u) == 0x7F80u && (code & 0x7Fu) != 0;
    ASSERT_EQ(back, nan ? 0x7FFF : code) << std::hex << "code 0x" << code;
    EXPECT_EQ(float_bits(round_bf16(f)), uint32_t(back) << 16);
  }
}

// ---- fp8 e4m3 ----------------------------------------------------------------------------------

// Decodes an e4m3fn code from its definition: bias 7, subnormals m/8 * 2^-6, S.1111.111 is NaN.
double reference_fp8_value(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xF, man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign ? -mag : mag;
}

// The 127 finite non-negative e4m3 values, indexed by code 0x00..0x7E (ascending).
std::vector<double> fp8_magnitudes() {
  std::vector<double> v;
  for (int code = 0; code <= 0x7E; ++code) v.push_back(reference_fp8_value(uint8_t(code)));
  return v;
}

// Brute force: the nearest of all finite values (ties to the even code), saturating at 448.
uint8_t reference_fp8(float f, const std::vector<double>& magnitudes) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const double mag = std::fabs(double(f));
  if (mag >= 448.0) return sign | 0x7E;  // satfinite: overflow and infinities
  int best = 0;
  for (int code = 1; code <= 0x7E; ++code) {
    const double d = std::fabs(magnitudes[code] - mag), best_d = std::fabs(magnitudes[best] - mag);
    if (d < best_d || (d == best_d && (code & 1) == 0)) best = code;
  }
  return uint8_t(sign | best);
}

TEST(DtypeFp8, DecodeMatchesDefinition) {
  for (int code = 0; code < 256; ++code) {
    const double want = reference_fp8_value(uint8_t(code));
    const float got = fp8_to_float(Fp8E4M3{uint8_t(code)});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << code;
    } else {
      EXPECT_EQ(double(got), want) << "code " << code;
      EXPECT_EQ(std::signbit(got), code >= 0x80) << "code " << code;  // -0 for 0x80
    }
  }
  EXPECT_EQ(fp8_to_float(Fp8E4M3{0x7E}), kFp8Max);
}

TEST(DtypeFp8, AllCodesRoundTrip) {
  for (int code = 0; code < 256; ++code) {
    const uint8_t back = float_to_fp8(fp8_to_float(Fp8E4M3{uint8_t(code)})).bits;
    if (code == 0x7F || code == 0xFF) {
      EXPECT_EQ(back, 0x7F) << "NaN code " << code << " must become the canonical 0x7F";
    } else {
      EXPECT_EQ(back, code);
    }
  }
}

TEST(DtypeFp8, EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_fp8(inf).bits, 0x7E);
  EXPECT_EQ(float_to_fp8(-inf).bits, 0xFE);
  EXPECT_EQ(float_to_fp8(std::numeric_limits<float>::quiet_NaN()).bits, 0x7F);
  EXPECT_EQ(float_to_fp8(-std::numeric_limits<float>::quiet_NaN()).bits, 0x7F);
  EXPECT_EQ(float_to_fp8(464.0f).bits, 0x7E);  // midpoint to the (absent) 480: saturates
  EXPECT_EQ(float_to_fp8(1e30f).bits, 0x7E);
  EXPECT_EQ(float_to_fp8(-500.0f).bits, 0xFE);
  EXPECT_EQ(float_to_fp8(-0.0f).bits, 0x80);
  EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -10)).bits, 0x00);   // half the smallest subnormal: even
  EXPECT_EQ(float_to_fp8(std::ldexp(3.0f, -10)).bits, 0x02);   // 1.5 subnormal steps: to even 2
  EXPECT_EQ(float_to_fp8(std::ldexp(15.0f, -10)).bits, 0x08);  // 7.5 steps: up to the min normal
  EXPECT_EQ(float_to_fp8(1.0625f).bits, 0x38);                 // tie between 1 and 1.125: even
  EXPECT_EQ(float_to_fp8(1.1875f).bits, 0x3A);                 // tie between 1.125 and 1.25
  EXPECT_EQ(float_to_fp8(std::numeric_limits<float>::denorm_min()).bits, 0x00);
}

TEST(DtypeFp8, EveryMidpointAndItsNeighbours) {
  const std::vector<double> mags = fp8_magnitudes();
  int checked = 0;
  for (size_t i = 0; i + 1 < mags.size(); ++i) {
    const float mid = float((mags[i] + mags[i + 1]) / 2);  // exact: 5 significant bits at most
    ASSERT_EQ(double(mid), (mags[i] + mags[i + 1]) / 2);
    const float probes[] = {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)};
    for (float probe : probes) {
      for (float f : {probe, -probe}) {
        ASSERT_EQ(float_to_fp8(f).bits, reference_fp8(f, mags)) << "input " << f;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 126 * 6);
}

TEST(DtypeFp8, MatchesBruteForceOnRandomFloats) {
  const std::vector<double> mags = fp8_magnitudes();
  Rng rng(202);
  for (int i = 0; i < 3'000'000; ++i) {
    uint32_t bits = uint32_t(rng.gen()());
    if (i % 3 != 0) {
      // Two thirds near fp8's range: exponents 2^-16 .. 2^12, so rounding paths dominate.
      const uint32_t exp = uint32_t(rng.integer(127 - 16, 127 + 12));
      bits = (bits & 0x807FFFFFu) | (exp << 23);
    }
    const float f = bits_float(bits);  // the other third: every exponent, denormals, inf, NaN
    const uint8_t got = float_to_fp8(f).bits, want = reference_fp8(f, mags);
    if (got != want) {
      ADD_FAILURE() << std::hex << "float bits 0x" << bits << ": got 0x" << int(got) << ", want 0x"
                    << int(want);
      break;
    }
  }
}

// ---- fp8 scales (DESIGN §3) ---------------------------------------------------------------------

// max(amax, 1e-4) / 448 in float64, rounded once to f32 (float64 division then rounding to f32
// equals the f32 division exactly: 53 >= 2 * 24 + 2).
float reference_exact_scale(float amax) {
  return float(std::max(double(amax), double(1e-4f)) / 448.0);
}

// The smallest power of two >= s.
float reference_ue8m0(float s) {
  int exp = 0;
  const double frac = std::frexp(double(s), &exp);
  return float(frac == 0.5 ? double(s) : std::ldexp(1.0, exp));
}

TEST(DtypeFp8Scale, ExactAndUe8m0) {
  Rng rng(303);
  std::vector<float> amaxes = {0.0f, 1e-6f,  1e-4f, 2e-4f,
                               1.0f, 448.0f, 1e4f,  std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 100'000; ++i) amaxes.push_back(std::exp(rng.uniform(-12.0f, 12.0f)));
  for (float amax : amaxes) {
    const float exact = fp8_scale_for_amax(amax, ScaleRounding::kExact);
    ASSERT_EQ(exact, reference_exact_scale(amax)) << "amax " << amax;
    const float pow2 = fp8_scale_for_amax(amax, ScaleRounding::kUe8m0);
    ASSERT_EQ(pow2, reference_ue8m0(exact)) << "amax " << amax;
    ASSERT_GE(pow2, exact);
    ASSERT_LT(pow2, 2 * exact);
    // The point of the scale: amax / scale never leaves e4m3's range.
    ASSERT_LE(std::max(double(amax), double(1e-4f)) / pow2, double(kFp8Max));
  }
  // The floor: tiny amax values share the 1e-4 scale.
  EXPECT_EQ(fp8_scale_for_amax(0.0f, ScaleRounding::kExact), 1e-4f / 448.0f);
  EXPECT_EQ(fp8_scale_for_amax(1e-9f, ScaleRounding::kExact), 1e-4f / 448.0f);
}

TEST(DtypeFp8Scale, PowersOfTwoStay) {
  for (int e = -10; e <= 10; ++e) {
    const float amax = std::ldexp(kFp8Max, e);  // scale exactly 2^e
    EXPECT_EQ(fp8_scale_for_amax(amax, ScaleRounding::kExact), std::ldexp(1.0f, e));
    EXPECT_EQ(fp8_scale_for_amax(amax, ScaleRounding::kUe8m0), std::ldexp(1.0f, e));
    // One ulp above rounds up to the next power of two.
    EXPECT_EQ(fp8_scale_for_amax(std::nextafter(amax, 1e30f), ScaleRounding::kUe8m0),
              std::ldexp(1.0f, e + 1));
  }
}

}  // namespace
}  // namespace dsa
