// fp8 weights with 128x128 block scales (GemmParams::w_fp8): the CPU GEMM on them is, bit for bit,
// the bf16 GEMM on the dequantized matrix (dequant_fp8_weight of every element), for n and k on
// and off the 128 grid, m in {1, 7, 64}, both output modes and strided operands; the operand
// checks name what is wrong; and a model holding its projections in fp8 (Weights::quantize_fp8)
// gives the logits of a bf16 model built from the dequantized weights, dense and MoE. fp8
// activations (GemmParams::x_fp8, --weights w8a8): the CPU GEMM is the definition of ops.h written
// out, bit for bit, a row's bits do not depend on its batch, and it stays within the e4m3
// rounding of x of the GEMM on the dequantized weights; a w8a8 model stays near the fp8 one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "common/expect_error.h"
#include "common/prefill_logits.h"
#include "common/test_util.h"
#include "dsa/backend.h"
#include "dsa/checkpoint.h"
#include "dsa/error.h"
#include "dsa/runner.h"
#include "dsa/token_codec.h"
#include "unit/ops_test_helpers.h"

namespace dsa {
namespace {

using ops_testing::same_bits;
using testing::kPoison;
using testing::Rng;

int64_t blocks(int64_t n) { return (n + kGemmFp8Block - 1) / kGemmFp8Block; }

// An fp8 weight matrix [n, k] with row stride ld (padding bytes are NaN codes, never read) and
// its scales [ceil(n/128), ld_scale] (padding NaN); and its dequantized bf16 copy, row stride k.
struct Fp8Matrix {
  int n = 0, k = 0;
  int64_t ld = 0, ld_scale = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<Bf16> dequant;
};

// kind 0: random codes (NaN excluded) and scales spread over 2^-24 .. 2^12, so the f32 products
// land everywhere and the bf16 rounding of the definition matters; kind 1: write_checkpoint's
// quantizer on random bf16 weights.
Fp8Matrix make_fp8(Rng& rng, int n, int k, int kind) {
  Fp8Matrix m;
  m.n = n, m.k = k, m.ld = k + 5, m.ld_scale = blocks(k) + 2;
  m.bytes.assign(size_t(n * m.ld), uint8_t(0x7F));
  m.scales.assign(size_t(blocks(n) * m.ld_scale), kPoison);
  if (kind == 0) {
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < k; ++c) {
        uint8_t q;
        do {
          q = uint8_t(rng.integer(0, 255));
        } while ((q & 0x7F) == 0x7F);
        m.bytes[size_t(r * m.ld + c)] = q;
      }
    }
    for (int64_t i = 0; i < blocks(n); ++i) {
      for (int64_t j = 0; j < blocks(k); ++j) {
        const float e = float(rng.integer(-24, 12));
        m.scales[size_t(i * m.ld_scale + j)] = std::ldexp(rng.uniform(0.5f, 1.0f), int(e));
      }
    }
  } else {
    const std::vector<Bf16> w = rng.bf16s(size_t(n) * k, 0.3f);
    const Fp8Blocks q = quantize_fp8_blocks(w.data(), n, k);
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < k; ++c) m.bytes[size_t(r * m.ld + c)] = q.bytes[size_t(r * k + c)];
    }
    for (int64_t i = 0; i < blocks(n); ++i) {
      for (int64_t j = 0; j < blocks(k); ++j) {
        m.scales[size_t(i * m.ld_scale + j)] = q.scales[size_t(i * blocks(k) + j)];
      }
    }
  }
  m.dequant.resize(size_t(n) * k);
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < k; ++c) {
      const float scale = m.scales[size_t(r / 128 * m.ld_scale + c / 128)];
      m.dequant[size_t(r * k + c)] =
          dequant_fp8_weight(Fp8E4M3{m.bytes[size_t(r * m.ld + c)]}, scale);
    }
  }
  return m;
}

TEST(Fp8Weights, DequantIsTheF32ProductRoundedToBf16) {
  // Every code, scales of every size: the definition, and its agreement with the loader's
  // historical formula (bf16 of the f32 product).
  const float scales[] = {1.0f, 0.00123f, 3.7e-7f, 1.0f / 448, 2.5e3f, 1e-30f};
  for (float s : scales) {
    for (int c = 0; c < 256; ++c) {
      const Fp8E4M3 q{uint8_t(c)};
      const Bf16 got = dequant_fp8_weight(q, s);
      const Bf16 want = float_to_bf16(fp8_to_float(q) * s);
      ASSERT_EQ(got.bits, want.bits) << "code " << c << " scale " << s;
    }
  }
  // The quantizer's round trip stays within one e4m3 step of the block's amax / 448 scale.
  Rng rng(3);
  const std::vector<Bf16> w = rng.bf16s(300 * 200, 0.3f);
  const Fp8Blocks q = quantize_fp8_blocks(w.data(), 300, 200);
  ASSERT_EQ(q.scales.size(), size_t(3 * 2));
  for (int r = 0; r < 300; ++r) {
    for (int c = 0; c < 200; ++c) {
      const float scale = q.scales[size_t(r / 128 * 2 + c / 128)];
      const float back =
          bf16_to_float(dequant_fp8_weight(Fp8E4M3{q.bytes[size_t(r * 200 + c)]}, scale));
      EXPECT_NEAR(back, bf16_to_float(w[size_t(r * 200 + c)]), 448 * scale / 8 + 1e-6f);
    }
  }
}

struct Fp8GemmCase {
  int n, k, kind;
};

class Fp8WeightGemm : public ::testing::TestWithParam<Fp8GemmCase> {};

TEST_P(Fp8WeightGemm, MatchesBf16GemmOnTheDequantizedWeightsBitwise) {
  const Fp8GemmCase c = GetParam();
  Rng rng(uint64_t(c.n * 7919 + c.k * 31 + c.kind));
  const Fp8Matrix w = make_fp8(rng, c.n, c.k, c.kind);
  for (int m : {1, 7, 64}) {
    for (GemmOutput output : {GemmOutput::kOverwrite, GemmOutput::kAccumulate}) {
      const int64_t ld_x = c.k + 3, ld_y = c.n + 2;
      std::vector<float> x = ops_testing::strided_normals(rng, m, c.k, ld_x);
      std::vector<float> y0(size_t(m * ld_y), kPoison);
      for (int r = 0; r < m; ++r) {
        for (int j = 0; j < c.n; ++j) y0[size_t(r * ld_y + j)] = rng.normal();
      }
      GemmParams p;
      p.x = x.data();
      p.m = m, p.n = c.n, p.k = c.k;
      p.ld_x = ld_x, p.ld_y = ld_y;
      p.output = output;
      p.alpha = output == GemmOutput::kAccumulate ? 0.75f : 1.0f;
      GemmParams bf = p;
      std::vector<float> y_bf16 = y0, y_fp8 = y0;
      bf.w = w.dequant.data();
      bf.ld_w = c.k;
      bf.y = y_bf16.data();
      GemmParams q = p;
      q.w_fp8 = w.bytes.data();
      q.w_scale = w.scales.data();
      q.ld_w = w.ld;
      q.ld_w_scale = w.ld_scale;
      q.y = y_fp8.data();
      cpu::gemm(bf);
      cpu::gemm(q);
      for (size_t i = 0; i < y0.size(); ++i) {
        ASSERT_TRUE(same_bits(y_fp8[i], y_bf16[i]))
            << "m " << m << " element " << i << ": " << y_fp8[i] << " vs " << y_bf16[i];
      }
      // Padding columns stay poisoned.
      for (int r = 0; r < m; ++r) {
        for (int64_t j = c.n; j < ld_y; ++j)
          ASSERT_TRUE(same_bits(y_fp8[size_t(r * ld_y + j)], kPoison));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8WeightGemm,
                         ::testing::Values(Fp8GemmCase{1, 1, 0}, Fp8GemmCase{5, 17, 0},
                                           Fp8GemmCase{130, 300, 0}, Fp8GemmCase{257, 129, 0},
                                           Fp8GemmCase{128, 256, 0}, Fp8GemmCase{64, 1000, 1},
                                           Fp8GemmCase{200, 384, 1}, Fp8GemmCase{300, 131, 1}),
                         [](const auto& test) {
                           return "n" + std::to_string(test.param.n) + "_k" +
                                  std::to_string(test.param.k) +
                                  (test.param.kind ? "_quantized" : "_codes");
                         });

TEST(Fp8Weights, OperandChecksNameTheProblem) {
  std::vector<float> x(64, 1.0f), y(64, 0.0f), scales(4, 1.0f);
  std::vector<Bf16> w(64, Bf16{0x3F80});
  std::vector<uint8_t> q(64, 0x38);
  GemmParams p;
  p.x = x.data(), p.y = y.data();
  p.m = 1, p.n = 8, p.k = 8, p.ld_x = 8, p.ld_w = 8, p.ld_y = 8;
  p.w_scale = scales.data(), p.ld_w_scale = 1;
  using testing::expect_error;
  GemmParams both = p;
  both.w = w.data(), both.w_fp8 = q.data();
  expect_error([&] { cpu::gemm(both); }, ErrorCode::kInvalidArgument, {"exactly one", "both"});
  expect_error([&] { cpu::gemm(p); }, ErrorCode::kInvalidArgument, {"exactly one", "neither"});
  GemmParams fp8 = p;
  fp8.w_fp8 = q.data();
  GemmParams kn = fp8;
  kn.layout = WeightLayout::kKN;
  expect_error([&] { cpu::gemm(kn); }, ErrorCode::kInvalidArgument, {"kNK"});
  GemmParams batched = fp8;
  batched.batch = 2, batched.batch_stride_x = 8, batched.batch_stride_y = 8;
  expect_error([&] { cpu::gemm(batched); }, ErrorCode::kInvalidArgument, {"batch 1"});
  GemmParams no_scale = fp8;
  no_scale.w_scale = nullptr;
  expect_error([&] { cpu::gemm(no_scale); }, ErrorCode::kInvalidArgument, {"w_scale"});
  GemmParams short_scale = fp8;
  short_scale.k = 200, short_scale.ld_x = 200, short_scale.ld_w = 200;
  expect_error([&] { cpu::gemm(short_scale); }, ErrorCode::kInvalidArgument, {"ld_w_scale"});
  EXPECT_NO_THROW(cpu::gemm(fp8));
  EXPECT_EQ(y[0], 8.0f);  // 0x38 is 1.0 in e4m3: eight ones
}

// ---- fp8 activations (x_fp8) -------------------------------------------------------------------

// ops.h's definition, written out without the CPU GEMM's loops: per row and 128-wide k block the
// encoder's scale (the largest |x|, fp8_scale_for_amax) and codes, the block's code products summed
// in ascending k, the blocks added in ascending order.
std::vector<float> w8a8_by_definition(const Fp8Matrix& w, const std::vector<float>& x, int64_t ld_x,
                                      int m, const std::vector<float>& y0, int64_t ld_y,
                                      GemmOutput output, float alpha) {
  std::vector<float> y = y0;
  for (int r = 0; r < m; ++r) {
    for (int n = 0; n < w.n; ++n) {
      float acc = 0.0f;
      for (int k0 = 0; k0 < w.k; k0 += kGemmFp8Block) {
        const int k1 = std::min(w.k, k0 + kGemmFp8Block);
        float amax = 0.0f;
        for (int c = k0; c < k1; ++c) amax = std::max(amax, std::fabs(x[size_t(r * ld_x + c)]));
        const float sx = fp8_scale_for_amax(amax, ScaleRounding::kExact);
        float part = 0.0f;
        for (int c = k0; c < k1; ++c) {
          const float qx = fp8_to_float(float_to_fp8(x[size_t(r * ld_x + c)] / sx));
          part += qx * fp8_to_float(Fp8E4M3{w.bytes[size_t(n * w.ld + c)]});
        }
        acc = acc + part * (sx * w.scales[size_t(n / 128 * w.ld_scale + k0 / 128)]);
      }
      float& out = y[size_t(r * ld_y + n)];
      out = output == GemmOutput::kOverwrite ? alpha * acc : out + alpha * acc;
    }
  }
  return y;
}

GemmParams w8a8_params(const Fp8Matrix& w, const float* x, int64_t ld_x, int m, float* y,
                       int64_t ld_y) {
  GemmParams p;
  p.x = x, p.y = y;
  p.m = m, p.n = w.n, p.k = w.k;
  p.ld_x = ld_x, p.ld_y = ld_y;
  p.w_fp8 = w.bytes.data(), p.w_scale = w.scales.data();
  p.ld_w = w.ld, p.ld_w_scale = w.ld_scale;
  p.x_fp8 = true;
  return p;
}

class W8a8Gemm : public ::testing::TestWithParam<Fp8GemmCase> {};

TEST_P(W8a8Gemm, IsTheDefinitionBitwise) {
  const Fp8GemmCase c = GetParam();
  Rng rng(uint64_t(c.n * 104729 + c.k * 17 + c.kind));
  const Fp8Matrix w = make_fp8(rng, c.n, c.k, c.kind);
  for (int m : {1, 7, 33}) {
    for (GemmOutput output : {GemmOutput::kOverwrite, GemmOutput::kAccumulate}) {
      const int64_t ld_x = c.k + 3, ld_y = c.n + 2;
      std::vector<float> x = ops_testing::strided_normals(rng, m, c.k, ld_x);
      // Rows of very different sizes (and one all-zero row): the per-row scale matters.
      for (int r = 0; r < m; ++r) {
        const float gain = r == 1 ? 0.0f : std::ldexp(1.0f, (r * 7) % 30 - 15);
        for (int k = 0; k < c.k; ++k) x[size_t(r * ld_x + k)] *= gain;
      }
      std::vector<float> y0(size_t(m * ld_y), kPoison);
      for (int r = 0; r < m; ++r) {
        for (int j = 0; j < c.n; ++j) y0[size_t(r * ld_y + j)] = rng.normal();
      }
      const float alpha = output == GemmOutput::kAccumulate ? 0.75f : 1.0f;
      std::vector<float> y = y0;
      GemmParams p = w8a8_params(w, x.data(), ld_x, m, y.data(), ld_y);
      p.output = output, p.alpha = alpha;
      cpu::gemm(p);
      const std::vector<float> want = w8a8_by_definition(w, x, ld_x, m, y0, ld_y, output, alpha);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(same_bits(y[i], want[i]))
            << "m " << m << " element " << i << ": " << y[i] << " vs " << want[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, W8a8Gemm,
                         ::testing::Values(Fp8GemmCase{1, 1, 0}, Fp8GemmCase{5, 17, 0},
                                           Fp8GemmCase{130, 300, 0}, Fp8GemmCase{257, 129, 0},
                                           Fp8GemmCase{64, 1000, 1}, Fp8GemmCase{200, 384, 1}),
                         [](const auto& test) {
                           return "n" + std::to_string(test.param.n) + "_k" +
                                  std::to_string(test.param.k) +
                                  (test.param.kind ? "_quantized" : "_codes");
                         });

TEST(W8a8, RowBitsDoNotDependOnTheBatch) {
  Rng rng(21);
  const Fp8Matrix w = make_fp8(rng, 150, 520, 1);
  const std::vector<float> probe = rng.normals(520);
  std::vector<float> alone;
  for (const auto [m, at] : {std::pair{1, 0}, {7, 0}, {7, 6}, {64, 31}}) {
    std::vector<float> x(size_t(m) * 520), y(size_t(m) * 150, kPoison);
    for (int r = 0; r < m; ++r) {
      for (int k = 0; k < 520; ++k) {
        x[size_t(r * 520 + k)] = r == at ? probe[size_t(k)] : 1e3f * rng.normal();
      }
    }
    cpu::gemm(w8a8_params(w, x.data(), 520, m, y.data(), 150));
    const std::vector<float> row(y.begin() + at * 150, y.begin() + (at + 1) * 150);
    if (alone.empty()) {
      alone = row;
      continue;
    }
    for (int j = 0; j < 150; ++j) {
      ASSERT_TRUE(same_bits(row[size_t(j)], alone[size_t(j)])) << "m " << m << " at " << at;
    }
  }
}

// x's e4m3 rounding (3 mantissa bits: a relative error of at most 2^-4 per value) is the only
// difference from the GEMM on the dequantized weights, so the outputs agree to about its size and
// are not the same numbers.
TEST(W8a8, StaysWithinTheRoundingOfXOfTheDequantizedGemm) {
  Rng rng(5);
  const Fp8Matrix w = make_fp8(rng, 256, 1024, 1);
  const int m = 16;
  const std::vector<float> x = rng.normals(size_t(m) * 1024);
  std::vector<float> y8(size_t(m) * 256), yd(size_t(m) * 256);
  cpu::gemm(w8a8_params(w, x.data(), 1024, m, y8.data(), 256));
  GemmParams d = w8a8_params(w, x.data(), 1024, m, yd.data(), 256);
  d.x_fp8 = false;
  cpu::gemm(d);
  double err = 0, ref = 0;
  for (size_t i = 0; i < y8.size(); ++i) {
    err += (double(y8[i]) - yd[i]) * (double(y8[i]) - yd[i]);
    ref += double(yd[i]) * yd[i];
  }
  const double nmse = err / ref;
  EXPECT_LT(nmse, 3e-3) << "the e4m3 rounding of x is at most 2^-4 relative";
  EXPECT_GT(nmse, 1e-6) << "x was not quantized";
}

TEST(W8a8, NeedsFp8Weights) {
  std::vector<float> x(8, 1.0f), y(8, 0.0f);
  std::vector<Bf16> w(64, Bf16{0x3F80});
  GemmParams p;
  p.x = x.data(), p.y = y.data(), p.w = w.data();
  p.m = 1, p.n = 8, p.k = 8, p.ld_x = 8, p.ld_w = 8, p.ld_y = 8;
  p.x_fp8 = true;
  testing::expect_error([&] { cpu::gemm(p); }, ErrorCode::kInvalidArgument,
                        {"x_fp8", "fp8 weights"});
}

// The producers' fp8 rows (Fp8Rows, ops.h): RMSNorm's and SwiGLU's are the encoder's rows of
// the values they wrote, and a w8a8 GEMM given them gives the bits of the one quantizing x itself.
TEST(W8a8, ProducersWriteTheRowsTheGemmWouldQuantize) {
  Rng rng(31);
  const int rows = 3, dim = 300, ld8 = 304, ld_scales = 8;  // a short last block of 44 columns
  const std::vector<float> x = rng.normals(size_t(rows) * dim, 2.0f);
  const std::vector<Bf16> nw = rng.bf16s(dim);
  std::vector<float> y(x.size());
  std::vector<uint8_t> codes(size_t(rows) * ld8, 0xA5);
  std::vector<float> scales(3 * ld_scales, -1.0f);
  RmsNormParams norm{x.data(), y.data(), nw.data(), rows, dim, dim, dim, 1e-6f};
  norm.y_fp8 = {codes.data(), scales.data(), ld8, ld_scales};
  cpu::rmsnorm(norm);
  std::vector<uint8_t> want_codes(codes.size(), 0xA5);
  std::vector<float> want_scales(scales.size(), -1.0f);
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < 3; ++b) {
      const int c0 = 128 * b, len = std::min(128, dim - c0);
      want_scales[size_t(b * ld_scales + r)] = encode_fp8_group(
          y.data() + r * dim + c0, len,
          reinterpret_cast<Fp8E4M3*>(want_codes.data() + r * ld8 + c0), ScaleRounding::kExact);
    }
  }
  EXPECT_EQ(codes, want_codes);
  for (size_t i = 0; i < scales.size(); ++i) {
    EXPECT_TRUE(same_bits(scales[i], want_scales[i])) << "scale " << i;
  }
  EXPECT_GT(want_scales[0], 0.0f);

  // SwiGLU's rows of its output.
  const std::vector<float> gate_up = rng.normals(size_t(rows) * 2 * dim, 3.0f);
  std::vector<float> act(size_t(rows) * dim);
  std::vector<uint8_t> act_codes(codes.size(), 0xA5);
  std::vector<float> act_scales(scales.size(), -1.0f);
  SwigluParams sw{gate_up.data(), act.data(), rows, dim, 2 * dim, dim};
  sw.out_fp8 = {act_codes.data(), act_scales.data(), ld8, ld_scales};
  cpu::swiglu(sw);
  for (int r = 0; r < rows; ++r) {
    std::vector<uint8_t> c(dim);
    for (int b = 0; b < 3; ++b) {
      const int c0 = 128 * b, len = std::min(128, dim - c0);
      const float s =
          encode_fp8_group(act.data() + r * dim + c0, len,
                           reinterpret_cast<Fp8E4M3*>(c.data() + c0), ScaleRounding::kExact);
      EXPECT_TRUE(same_bits(act_scales[size_t(b * ld_scales + r)], s)) << r << " " << b;
    }
    EXPECT_TRUE(std::equal(c.begin(), c.end(), act_codes.begin() + r * ld8)) << "row " << r;
  }

  // The GEMM given the norm's rows, and quantizing y itself: the same bits.
  const Fp8Matrix w = make_fp8(rng, 70, dim, 1);
  std::vector<float> y_own(size_t(rows) * 70), y_given(y_own.size());
  cpu::gemm(w8a8_params(w, y.data(), dim, rows, y_own.data(), 70));
  GemmParams g = w8a8_params(w, y.data(), dim, rows, y_given.data(), 70);
  g.x8 = norm.y_fp8;
  cpu::gemm(g);
  for (size_t i = 0; i < y_own.size(); ++i) ASSERT_TRUE(same_bits(y_own[i], y_given[i])) << i;
  // Given rows are what the GEMM reads: others (here, y's codes zeroed) change the result.
  std::vector<uint8_t> zero(codes.size(), 0);
  g.x8.codes = zero.data();
  cpu::gemm(g);
  EXPECT_TRUE(std::all_of(y_given.begin(), y_given.end(), [](float v) { return v == 0.0f; }));
}

TEST(W8a8, RefusesGivenRowsItCannotRead) {
  Rng rng(33);
  const Fp8Matrix w = make_fp8(rng, 16, 256, 1);
  std::vector<float> x(2 * 256, 1.0f), y(2 * 16);
  std::vector<uint8_t> codes(2 * 256);
  std::vector<float> scales(2 * 2);
  GemmParams g = w8a8_params(w, x.data(), 256, 2, y.data(), 16);
  g.x8 = {codes.data(), scales.data(), 200, 2};  // ld shorter than k
  testing::expect_error([&] { cpu::gemm(g); }, ErrorCode::kInvalidArgument, {"x8", "ld 200"});
  g.x8 = {codes.data(), scales.data(), 256, 2};
  g.x_fp8 = false;
  testing::expect_error([&] { cpu::gemm(g); }, ErrorCode::kInvalidArgument, {"x8", "x_fp8"});
}

// ---- the model -------------------------------------------------------------------------------

// The logits of one eager prefill step of a short prompt.
std::vector<float> step_logits(Backend& be, const ModelConfig& config, Weights w) {
  return prefill_logits(be, config, std::move(w), {3, 141, 59, 26, 53, 58, 97, 93, 238, 46});
}

class Fp8WeightModel : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8WeightModel, MatchesTheBf16ModelOnTheDequantizedWeights) {
  auto be = make_cpu_backend();
  const ModelConfig config = preset_config(GetParam());
  Weights fp8 = Weights::synthetic(*be, config, 11);
  fp8.quantize_fp8(*be);
  // The bf16 model: every tensor's dequantized values (the bf16 ones as they are).
  Weights bf16;
  int kept = 0;
  for (const auto& [name, t] : fp8.tensors()) {
    EXPECT_EQ(t.is_fp8(), weight_kept_fp8(name, t.shape)) << name;
    kept += t.is_fp8();
    bf16.add(*be, name, t.shape, fp8.host_bf16(*be, name));
  }
  EXPECT_GT(kept, 0);
  EXPECT_TRUE(fp8.tensors().at("model.layers.0.self_attn.q_a_proj.weight").is_fp8());
  EXPECT_FALSE(fp8.tensors().at("model.layers.0.self_attn.kv_b_proj.weight").is_fp8());
  EXPECT_FALSE(fp8.tensors().at("lm_head.weight").is_fp8());
  testing::expect_error(
      [&] {
        fp8.get("model.layers.0.self_attn.o_proj.weight",
                fp8.tensors().at("model.layers.0.self_attn.o_proj.weight").shape);
      },
      ErrorCode::kInvalidArgument, {"held as fp8"});
  const std::vector<float> want = step_logits(*be, config, std::move(bf16));
  const std::vector<float> got = step_logits(*be, config, std::move(fp8));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(same_bits(got[i], want[i])) << "logit " << i << ": " << got[i] << " vs " << want[i];
  }
}

// A checkpoint's fp8 tensors kept as stored (CheckpointLoadOptions::keep_fp8): the logits of the
// same checkpoint loaded as bf16, bit for bit, since both read dequant_fp8_weight's values.
TEST_P(Fp8WeightModel, CheckpointKeptFp8MatchesItsBf16Load) {
  auto be = make_cpu_backend();
  const ModelConfig config = preset_config(GetParam());
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    fmt::format("dsa_fp8w_{}_{}", ::getpid(), config.name);
  CheckpointWriteOptions write;
  write.fp8 = true;
  write.existing = ExistingCheckpoint::kReplace;
  write_checkpoint(*be, config, Weights::synthetic(*be, config, 12), dir.string(), write);
  CheckpointLoadOptions keep;
  keep.keep_fp8 = true;
  Weights fp8 = load_checkpoint(*be, dir.string(), nullptr, keep);
  Weights bf16 = load_checkpoint(*be, dir.string());
  std::filesystem::remove_all(dir);
  for (const auto& [name, t] : fp8.tensors()) {
    EXPECT_EQ(t.is_fp8(), weight_kept_fp8(name, t.shape)) << name;
    EXPECT_FALSE(bf16.tensors().at(name).is_fp8()) << name;
  }
  const std::vector<float> want = step_logits(*be, config, std::move(bf16));
  const std::vector<float> got = step_logits(*be, config, std::move(fp8));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(same_bits(got[i], want[i])) << "logit " << i << ": " << got[i] << " vs " << want[i];
  }
}

// WeightDtype::kW8A8: the fp8 model's bytes with every fp8 projection's x quantized too. Its
// logits differ from the fp8 model's (the activations were rounded) by about the size of that
// rounding, and the bf16 tensors (lm_head, kv_b) come out without x_fp8.
TEST_P(Fp8WeightModel, W8a8StaysNearTheFp8Model) {
  auto be = make_cpu_backend();
  const ModelConfig config = preset_config(GetParam());
  Weights fp8 = Weights::synthetic(*be, config, 13);
  fp8.quantize_fp8(*be);
  Weights w8a8 = Weights::synthetic(*be, config, 13);
  w8a8.quantize_fp8(*be);
  w8a8.set_fp8_activations(true);
  const auto& o = w8a8.tensors().at("model.layers.0.self_attn.o_proj.weight");
  EXPECT_TRUE(w8a8.matrix("model.layers.0.self_attn.o_proj.weight", o.shape).x_fp8);
  EXPECT_FALSE(fp8.matrix("model.layers.0.self_attn.o_proj.weight", o.shape).x_fp8);
  const auto& head = w8a8.tensors().at("lm_head.weight");
  EXPECT_FALSE(w8a8.matrix("lm_head.weight", head.shape).x_fp8);
  const std::vector<float> want = step_logits(*be, config, std::move(fp8));
  const std::vector<float> got = step_logits(*be, config, std::move(w8a8));
  ASSERT_EQ(got.size(), want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i;
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    ref += double(want[i]) * want[i];
  }
  // Measured: 5.1e-3 (tiny), 1.6e-2 (tiny-moe), through every layer's projections.
  EXPECT_LT(err / ref, 0.05);
  EXPECT_GT(err / ref, 1e-8) << "the activations were not quantized";
}

INSTANTIATE_TEST_SUITE_P(Presets, Fp8WeightModel, ::testing::Values("tiny", "tiny-moe"),
                         [](const auto& test) {
                           std::string s = test.param;
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s;
                         });

TEST(Fp8Weights, MemoryEstimateCountsTheSmallerBytes) {
  const ModelConfig config = preset_config("v32");
  const MemoryEstimate bf16 = estimate_memory(config, 1, 1, CacheConfig{});
  const MemoryEstimate fp8 = estimate_memory(config, 1, 1, CacheConfig{}, WeightDtype::kFp8);
  uint64_t want = 0;
  for (const WeightSpec& spec : weight_manifest(config)) {
    uint64_t n = 1;
    for (int64_t d : spec.shape) n *= uint64_t(d);
    want += weight_kept_fp8(spec.name, spec.shape)
                ? n + 4 * uint64_t(blocks(spec.shape[0]) * blocks(spec.shape[1]))
                : 2 * n;
  }
  EXPECT_EQ(fp8.weights, want);
  EXPECT_LT(fp8.weights, bf16.weights);
  EXPECT_EQ(fp8.scratch, bf16.scratch);
}

}  // namespace
}  // namespace dsa
