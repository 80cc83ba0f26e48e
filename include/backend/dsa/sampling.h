// The arithmetic of token sampling, shared by the CPU reference (src/backend/cpu/sample.cpp) and
// the CUDA kernels (src/backend/cuda/sample.cu), so both backends draw the same token from the
// same logits, bit for bit. Includable from CUDA code.
//
// A row's draw, given logits l[0, V), temperature T, top_p, seed and index:
//   1. best = the largest non-NaN logit, ties to the lower id (-1 when every logit is NaN); top is
//      its value. Greedy (T <= 0), or an infinite top, gives best.
//   2. Integer weights relative to the top: w_i = floor(e^((l_i - top) / T) * 2^31), with e^x from
//      sample_exp below (no libm, no reordering: the same bits everywhere). NaN logits weigh 0, as
//      does anything below about 2^-31 of the top token. W = sum w_i (exact: integers).
//   3. The nucleus: every token whose weight is >= c, for the largest weight c whose tokens, with
//      all heavier ones, hold at least need = sample_need(W, top_p) (ties at the cut all join).
//      M is the nucleus's mass.
//   4. The draw: target = floor(u * M) with u = sample_uniform(seed, index); the token is the
//      first one, in ascending id order over the nucleus, whose running weight sum exceeds target.
// Every quantity after step 2 is an integer, so any summation order gives the same result: the
// kernels reduce in parallel, the CPU in a loop.
#pragma once

#include <cmath>
#include <cstdint>

#include "dsa/dtype.h"

namespace dsa {

inline constexpr int kSampleWeightBits = 31;     // the top token weighs 2^31
inline constexpr int kMaxSampleVocab = 1 << 22;  // keeps every mass below 2^53 (exact in double)

// A uniform double in [0, 1) from (seed, index) alone: splitmix64 over a key mixing both inputs;
// the top 53 bits make the double.
DSA_HD double sample_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

// a * b + c with one rounding, on either side (the CPU's std::fma is correctly rounded too).
DSA_HD double sample_fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// e^x for x <= 0, 0 below -708 (and for NaN). Reduction x = n ln2 + r with |r| <= ln2 / 2 (ln 2
// split in two so n * hi is exact), then Taylor to r^12 by Horner: relative error below 1e-15.
// Every step is an fma, floor or ldexp, so the result has the same bits on every backend.
DSA_HD double sample_exp(double x) {
  if (!(x >= -708.0)) return 0.0;
  const double n = floor(sample_fma(x, 0x1.71547652b82fep+0, 0.5));  // round(x / ln 2)
  double r = sample_fma(-n, 0x1.62e42fee00000p-1, x);
  r = sample_fma(-n, 0x1.a39ef35793c76p-33, r);
  double p = 0x1.1eed8eff8d898p-29;  // 1/12!
  p = sample_fma(p, r, 0x1.ae64567f544e4p-26);
  p = sample_fma(p, r, 0x1.27e4fb7789f5cp-22);
  p = sample_fma(p, r, 0x1.71de3a556c734p-19);
  p = sample_fma(p, r, 0x1.a01a01a01a01ap-16);
  p = sample_fma(p, r, 0x1.a01a01a01a01ap-13);
  p = sample_fma(p, r, 0x1.6c16c16c16c17p-10);
  p = sample_fma(p, r, 0x1.1111111111111p-7);
  p = sample_fma(p, r, 0x1.5555555555555p-5);
  p = sample_fma(p, r, 0x1.5555555555555p-3);
  p = sample_fma(p, r, 0.5);
  p = sample_fma(p, r, 1.0);
  p = sample_fma(p, r, 1.0);
  return ldexp(p, int(n));
}

// Greedy unless the temperature is a positive number (NaN and negatives, which validation
// rejects, cannot reach a kernel except through planted garbage; they draw greedily).
DSA_HD bool sample_is_greedy(float temperature) { return !(temperature > 0.0f); }

// The weight of a logit relative to the top one, in [0, 2^31]: floor(e^((l - top) / T) * 2^31).
DSA_HD uint32_t sample_weight(float logit, float top, float temperature) {
  const double x = (double(logit) - double(top)) / double(temperature);
  if (!(x >= -22.5)) return 0;  // e^-22.5 * 2^31 < 1; NaN too
  return uint32_t(ldexp(sample_exp(x), kSampleWeightBits));
}

// The mass the nucleus must reach: top_p of the total, less a relative 2^-20 of slack (logits are
// f32, so a nucleus whose mass is top_p up to their rounding stops there), at least 1. top_p >= 1
// takes every token of positive weight.
DSA_HD uint64_t sample_need(uint64_t total, float top_p) {
  if (!(top_p < 1.0f)) return total;
  const double t = double(total);
  const double need = ceil(sample_fma(t, double(top_p), -(t * 0x1p-20)));
  return need >= 1.0 ? uint64_t(need) : 1;  // top_p <= 0 or NaN (garbage): the top token alone
}

// floor(u * mass), in [0, mass).
DSA_HD uint64_t sample_target(double u, uint64_t mass) {
  const uint64_t t = uint64_t(floor(u * double(mass)));
  return t < mass ? t : mass - 1;
}

// The host reference of one row's draw (cpu/sample.cpp), also used by the runtime's sampler.
struct SampleDraw {
  int32_t token = -1;  // -1 when every logit is NaN
  int32_t best = -1;   // the argmax (ties to the lower id)
  uint32_t cut = 0;    // the nucleus's smallest weight (0 when the draw was greedy)
  uint64_t mass = 0;   // the nucleus's mass M
  uint64_t total = 0;  // W
  double logprob = 0;  // log softmax(logits)[token] at temperature 1 (0 for an infinite top)
};
// `weights`, when set, receives w_i (left empty for a greedy draw).
SampleDraw sample_row(const float* logits, int vocab, float temperature, float top_p, uint64_t seed,
                      uint64_t index, bool want_logprob, uint32_t* weights = nullptr);

}  // namespace dsa
