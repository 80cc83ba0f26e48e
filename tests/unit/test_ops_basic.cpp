// The CPU reference ops against naive float64 references, on fresh random inputs.
//
// Every tolerance below is a first-order rounding-error bound for the op's f32 evaluation order,
// in units of u = 2^-24 (f32's unit roundoff), with the reasoning next to it. Besides values, the
// tests check that outputs are fully written (they are NaN-poisoned first), that padding columns
// of strided rows keep their poison bits, that in-place forms match out-of-place ones bit for bit,
// and batch invariance: a row run inside a batch has the same bits as the row run alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/backend.h"
#include "dsa/error.h"
#include "dsa/token_codec.h"
#include "unit/ops_test_helpers.h"

namespace dsa {
namespace {

using ops_testing::expect_batch_invariant;
using ops_testing::expect_padding_untouched;
using ops_testing::kU;
using ops_testing::poisoned;
using ops_testing::same_bits;
using ops_testing::strided_normals;
using ops_testing::widen;
using testing::kPoison;
using testing::Rng;

// ---- RMSNorm / LayerNorm ----------------------------------------------------------------------

TEST(OpsNorm, RmsNormMatchesFloat64) {
  Rng rng(1);
  for (int dim : {7, 256, 1024}) {
    const int rows = 5;
    const int64_t ld_x = dim + 3, ld_y = dim + 5;
    const auto x = strided_normals(rng, rows, dim, ld_x, 2.0f);
    const auto weight = rng.bf16s(size_t(dim));
    auto y = poisoned(size_t(rows * ld_y));
    cpu::rmsnorm({.x = x.data(),
                  .y = y.data(),
                  .weight = weight.data(),
                  .rows = rows,
                  .dim = dim,
                  .ld_x = ld_x,
                  .ld_y = ld_y,
                  .eps = 1e-6f});
    // The sum of dim positive squares in ascending order is within (dim + 1)u relative; the sqrt
    // halves that, and the reciprocal, eps add, division and two products add ~5u.
    const double tol = (dim / 2.0 + 8) * kU;
    for (int r = 0; r < rows; ++r) {
      const float* xr = &x[size_t(r * ld_x)];
      double ms = 0;
      for (int i = 0; i < dim; ++i) ms += double(xr[i]) * xr[i];
      const double inv_rms = 1.0 / std::sqrt(ms / dim + 1e-6f);
      for (int i = 0; i < dim; ++i) {
        const double ref = xr[i] * inv_rms * widen(weight[size_t(i)]);
        ASSERT_NEAR(y[size_t(r * ld_y + i)], ref, tol * std::fabs(ref)) << "dim " << dim;
      }
    }
    expect_padding_untouched(y, rows, dim, ld_y);
  }
}

TEST(OpsNorm, LayerNormMatchesFloat64WithAndWithoutBias) {
  Rng rng(2);
  for (int dim : {5, 128, 1024}) {
    for (bool with_bias : {true, false}) {
      const int rows = 4;
      const int64_t ld_x = dim + 2, ld_y = dim + 6;
      const auto x = strided_normals(rng, rows, dim, ld_x, 1.5f, 3.0f);  // mean 3: two-pass matters
      const auto weight = rng.bf16s(size_t(dim)), bias = rng.bf16s(size_t(dim));
      auto y = poisoned(size_t(rows * ld_y));
      cpu::layernorm({.x = x.data(),
                      .y = y.data(),
                      .weight = weight.data(),
                      .bias = with_bias ? bias.data() : nullptr,
                      .rows = rows,
                      .dim = dim,
                      .ld_x = ld_x,
                      .ld_y = ld_y,
                      .eps = 1e-5f});
      for (int r = 0; r < rows; ++r) {
        const float* xr = &x[size_t(r * ld_x)];
        double mean = 0, var = 0;
        for (int i = 0; i < dim; ++i) mean += xr[i];
        mean /= dim;
        for (int i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        const double inv_std = 1.0 / std::sqrt(var / dim + 1e-5f);
        for (int i = 0; i < dim; ++i) {
          const double w = widen(weight[size_t(i)]), b = with_bias ? widen(bias[size_t(i)]) : 0.0;
          const double ref = (xr[i] - mean) * inv_std * w + b;
          // The f32 mean errs by up to dim*u*mean|x| (ascending sum), so x - mean errs by
          // (dim + 1)u (|x| + |mean|); the variance adds dim*u relative. Scaled by inv_std * |w|,
          // plus a few roundings of the result.
          const double tol = (dim + 8) * kU *
                             ((std::fabs(xr[i]) + std::fabs(mean)) * inv_std * std::fabs(w) +
                              std::fabs(b) + std::fabs(ref));
          ASSERT_NEAR(y[size_t(r * ld_y + i)], ref, tol) << "dim " << dim << " bias " << with_bias;
        }
      }
      expect_padding_untouched(y, rows, dim, ld_y);
    }
  }
}

TEST(OpsNorm, InPlaceEqualsOutOfPlace) {
  Rng rng(3);
  const int rows = 3, dim = 256;
  const int64_t ld = dim + 4;
  const auto x = strided_normals(rng, rows, dim, ld);
  const auto weight = rng.bf16s(dim), bias = rng.bf16s(dim);
  for (bool layer : {false, true}) {
    auto out = poisoned(x.size());
    auto in_place = x;
    for (float* y : {out.data(), in_place.data()}) {
      const float* src = y == out.data() ? x.data() : in_place.data();
      if (layer) {
        cpu::layernorm({.x = src,
                        .y = y,
                        .weight = weight.data(),
                        .bias = bias.data(),
                        .rows = rows,
                        .dim = dim,
                        .ld_x = ld,
                        .ld_y = ld});
      } else {
        cpu::rmsnorm({.x = src,
                      .y = y,
                      .weight = weight.data(),
                      .rows = rows,
                      .dim = dim,
                      .ld_x = ld,
                      .ld_y = ld});
      }
    }
    for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(out[i], in_place[i])) << i;
  }
}

TEST(OpsNorm, BatchInvariant) {
  Rng rng(4);
  const int rows = 6, dim = 512;
  const int64_t ld = dim + 1;
  const auto x = strided_normals(rng, rows, dim, ld);
  const auto weight = rng.bf16s(dim), bias = rng.bf16s(dim);
  for (bool layer : {false, true}) {
    expect_batch_invariant(rows, ld, [&](int first, int count) {
      auto y = poisoned(x.size());
      const float* xs = x.data() + first * ld;
      float* ys = y.data() + first * ld;
      if (layer) {
        cpu::layernorm({.x = xs,
                        .y = ys,
                        .weight = weight.data(),
                        .bias = bias.data(),
                        .rows = count,
                        .dim = dim,
                        .ld_x = ld,
                        .ld_y = ld});
      } else {
        cpu::rmsnorm({.x = xs,
                      .y = ys,
                      .weight = weight.data(),
                      .rows = count,
                      .dim = dim,
                      .ld_x = ld,
                      .ld_y = ld});
      }
      return y;
    });
  }
}

// ---- RoPE --------------------------------------------------------------------------------------

// cos/sin of position * theta^(-2i/rope_dim), as [max_position, rope_dim/2, 2] f32.
std::vector<float> rope_table(int max_position, int rope_dim) {
  std::vector<float> t;
  for (int pos = 0; pos < max_position; ++pos) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double angle = pos * std::pow(10000.0, -2.0 * i / rope_dim);
      t.push_back(float(std::cos(angle)));
      t.push_back(float(std::sin(angle)));
    }
  }
  return t;
}

struct RopeCase {
  RopeStyle style;
  int head_dim, offset, rope_dim;  // MLA: 192 = nope 128 + rope 64; indexer: rope first of 128
};

class OpsRope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(OpsRope, MatchesFloat64AndLeavesEverythingElse) {
  const RopeCase c = GetParam();
  Rng rng(5);
  const int rows = 5, heads = 3, max_position = 300;
  const int64_t ld_head = c.head_dim + 2, ld_row = heads * ld_head + 5;
  const auto table = rope_table(max_position, c.rope_dim);
  // Rows 3 and 4 are out of the table's range: they must stay untouched.
  const std::vector<int32_t> positions = {int32_t(rng.integer(1, 299)), 0, 299, max_position, -1};
  std::vector<float> x(size_t(rows * ld_row), kPoison);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < c.head_dim; ++i) x[size_t(r * ld_row + h * ld_head + i)] = rng.normal();
    }
  }
  auto out = x;
  cpu::rope({.x = out.data(),
             .positions = positions.data(),
             .cos_sin = table.data(),
             .rows = rows,
             .heads = heads,
             .ld_row = ld_row,
             .ld_head = ld_head,
             .offset = c.offset,
             .rope_dim = c.rope_dim,
             .max_position = max_position,
             .style = c.style});
  const int half = c.rope_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const bool rotated = positions[size_t(r)] >= 0 && positions[size_t(r)] < max_position;
    std::vector<bool> roped(size_t(ld_row), false);
    for (int h = 0; rotated && h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const int64_t base = r * ld_row + h * ld_head + c.offset;
        const int64_t a = base + (c.style == RopeStyle::kInterleaved ? 2 * i : i);
        const int64_t b = a + (c.style == RopeStyle::kInterleaved ? 1 : half);
        const double cs = table[size_t((positions[size_t(r)] * half + i) * 2)];
        const double sn = table[size_t((positions[size_t(r)] * half + i) * 2 + 1)];
        const double xa = x[size_t(a)], xb = x[size_t(b)];
        // Two rounded products and one rounded sum: within 2u(|x c| + |y s|) + u|result|.
        const double tol = 4 * kU * (std::fabs(xa) + std::fabs(xb));
        ASSERT_NEAR(out[size_t(a)], xa * cs - xb * sn, tol) << "row " << r << " head " << h;
        ASSERT_NEAR(out[size_t(b)], xa * sn + xb * cs, tol) << "row " << r << " head " << h;
        roped[size_t(a - r * ld_row)] = roped[size_t(b - r * ld_row)] = true;
      }
    }
    // Every other element (nope dims, padding, unrotated rows) keeps its bits.
    for (int64_t i = 0; i < ld_row; ++i) {
      if (roped[size_t(i)]) continue;
      const size_t at = size_t(r * ld_row + i);
      ASSERT_TRUE(same_bits(out[at], x[at])) << "row " << r << " col " << i;
    }
  }
  expect_batch_invariant(rows, ld_row, [&](int first, int count) {
    auto y = x;
    cpu::rope({.x = y.data() + first * ld_row,
               .positions = positions.data() + first,
               .cos_sin = table.data(),
               .rows = count,
               .heads = heads,
               .ld_row = ld_row,
               .ld_head = ld_head,
               .offset = c.offset,
               .rope_dim = c.rope_dim,
               .max_position = max_position,
               .style = c.style});
    return y;
  });
}

INSTANTIATE_TEST_SUITE_P(OpsAllStyles, OpsRope,
                         ::testing::Values(RopeCase{RopeStyle::kInterleaved, 192, 128, 64},
                                           RopeCase{RopeStyle::kHalfSplit, 128, 0, 64},
                                           RopeCase{RopeStyle::kHalfSplit, 40, 6, 8},
                                           RopeCase{RopeStyle::kInterleaved, 40, 3, 8}));

TEST(OpsRopeStyles, HalfSplitIsInterleavedUnderAPermutation) {
  // Half-split on x equals interleaved on x with dims (i, i + half) moved to (2i, 2i + 1).
  Rng rng(6);
  const int rope_dim = 64, half = 32, max_position = 64;
  const auto table = rope_table(max_position, rope_dim);
  const int32_t position = 37;
  const auto x = rng.normals(rope_dim);
  std::vector<float> split = x, inter(rope_dim);
  for (int i = 0; i < half; ++i) {
    inter[size_t(2 * i)] = x[size_t(i)];
    inter[size_t(2 * i + 1)] = x[size_t(i + half)];
  }
  for (auto [buf, style] :
       {std::pair{&split, RopeStyle::kHalfSplit}, std::pair{&inter, RopeStyle::kInterleaved}}) {
    cpu::rope({.x = buf->data(),
               .positions = &position,
               .cos_sin = table.data(),
               .rows = 1,
               .heads = 1,
               .ld_row = rope_dim,
               .ld_head = rope_dim,
               .rope_dim = rope_dim,
               .max_position = max_position,
               .style = style});
  }
  for (int i = 0; i < half; ++i) {
    EXPECT_TRUE(same_bits(split[size_t(i)], inter[size_t(2 * i)])) << i;
    EXPECT_TRUE(same_bits(split[size_t(i + half)], inter[size_t(2 * i + 1)])) << i;
  }
  EXPECT_FALSE(same_bits(split[1], x[1]));  // the rotation did something
}

// ---- Hadamard ----------------------------------------------------------------------------------

TEST(OpsHadamard, MatchesSylvesterMatrix) {
  Rng rng(7);
  for (int dim : {1, 2, 64, 128, 1024}) {
    const int rows = 3;
    const int64_t ld = dim + 4;
    const float scale = dim == 1 ? 0.5f : float(1.0 / std::sqrt(double(dim)));
    const auto x = strided_normals(rng, rows, dim, ld);
    auto out = x;
    cpu::hadamard({.x = out.data(), .rows = rows, .dim = dim, .ld = ld, .scale = scale});
    const int stages = std::countr_zero(unsigned(dim));
    for (int r = 0; r < rows; ++r) {
      const float* xr = &x[size_t(r * ld)];
      double l1 = 0;
      for (int j = 0; j < dim; ++j) l1 += std::fabs(xr[j]);
      // Each of log2(dim) butterfly stages rounds once, on values bounded by sum|x|; the scaling
      // rounds once more.
      const double tol = (stages + 2) * kU * scale * l1;
      for (int i = 0; i < dim; ++i) {
        double ref = 0;  // Sylvester order: H[i, j] = (-1)^popcount(i & j)
        for (int j = 0; j < dim; ++j)
          ref += (std::popcount(unsigned(i & j)) & 1 ? -1.0 : 1.0) * xr[j];
        ASSERT_NEAR(out[size_t(r * ld + i)], scale * ref, tol) << "dim " << dim << " i " << i;
      }
    }
    expect_padding_untouched(out, rows, dim, ld);
  }
}

TEST(OpsHadamard, OrthonormalTwiceIsIdentity) {
  Rng rng(8);
  for (int dim : {2, 128, 1024}) {
    const int rows = 2;
    const int64_t ld = dim;
    const float scale = float(1.0 / std::sqrt(double(dim)));
    const auto x = strided_normals(rng, rows, dim, ld);
    auto twice = x;
    for (int pass = 0; pass < 2; ++pass) {
      cpu::hadamard({.x = twice.data(), .rows = rows, .dim = dim, .ld = ld, .scale = scale});
    }
    // In the 2-norm each stage errs by u of its (sqrt(2)-scaled orthogonal) output, each scaling
    // by u, and the rounded scale^2 misses 1/dim by 2u: (2 log2(dim) + 4)u of |x|_2 in all,
    // doubled for second-order terms. An element's error is at most the vector's.
    const double tol_rel = 2 * (2 * std::countr_zero(unsigned(dim)) + 4) * kU;
    for (int r = 0; r < rows; ++r) {
      double norm = 0;
      for (int i = 0; i < dim; ++i) norm += double(x[size_t(r * ld + i)]) * x[size_t(r * ld + i)];
      for (int i = 0; i < dim; ++i) {
        ASSERT_NEAR(twice[size_t(r * ld + i)], x[size_t(r * ld + i)], tol_rel * std::sqrt(norm));
      }
    }
  }
}

TEST(OpsHadamard, BatchInvariantAndRejectsBadDims) {
  Rng rng(9);
  const int rows = 5, dim = 128;
  const int64_t ld = dim + 3;
  const auto x = strided_normals(rng, rows, dim, ld);
  expect_batch_invariant(rows, ld, [&](int first, int count) {
    auto y = x;
    cpu::hadamard({.x = y.data() + first * ld, .rows = count, .dim = dim, .ld = ld, .scale = 0.3f});
    return y;
  });
  auto y = x;
  for (int bad : {0, 3, 96, 2048}) {
    EXPECT_THROW(cpu::hadamard({.x = y.data(), .rows = 1, .dim = bad, .ld = 4096}), Error) << bad;
  }
}

// indexer_query with a row stride past its packed heads (the model's fused q_b | wq_b output): each
// row's heads get exactly the bits of the packed op on the same row, and the columns between rows
// stay as they were.
TEST(OpsIndexerQuery, RowStrideGivesThePackedBits) {
  Rng rng(41);
  const int rows = 6, heads = 3, max_position = 64;
  const int dim = heads * kIndexHeadDim;
  const int64_t ld = dim + 72;
  const auto table = rope_table(max_position, kRopeDim);
  std::vector<int32_t> positions(rows);
  for (int r = 0; r < rows; ++r) positions[r] = int32_t(rng.integer(0, max_position - 1));
  const auto x = strided_normals(rng, rows, dim, ld, 2.0f);
  std::unique_ptr<Backend> be = make_cpu_backend();
  for (RopeStyle style : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
    auto strided = x;
    be->indexer_query({strided.data(), ld, rows, heads, positions.data(), table.data(),
                       max_position, style, 0.125f});
    expect_padding_untouched(strided, rows, dim, ld);
    std::vector<float> packed(size_t(rows) * dim);
    for (int r = 0; r < rows; ++r) {
      std::copy_n(x.begin() + r * ld, dim, packed.begin() + int64_t(r) * dim);
    }
    be->indexer_query({packed.data(), dim, rows, heads, positions.data(), table.data(),
                       max_position, style, 0.125f});
    int changed = 0;
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < dim; ++i) {
        EXPECT_TRUE(same_bits(strided[size_t(r * ld + i)], packed[size_t(r * dim + i)]))
            << "row " << r << " column " << i;
        changed += !same_bits(strided[size_t(r * ld + i)], x[size_t(r * ld + i)]);
      }
    }
    EXPECT_GT(changed, rows * dim / 2);  // the op did run
  }
  auto y = x;
  EXPECT_THROW(be->indexer_query({y.data(), dim - 1, rows, heads, positions.data(), table.data(),
                                  max_position, RopeStyle::kHalfSplit, 1.0f}),
               Error);
}

// indexer_query's fp8 encoding (q_fp8): each head's bytes and scale are those of the group
// encoder over the op's own result (what indexer_logits makes of q for an fp8 cache), written at
// the row stride asked for and nowhere else; q itself gets the bits it gets without them.
TEST(OpsIndexerQuery, Fp8EncodingIsTheGroupEncoderOfTheResult) {
  Rng rng(43);
  const int rows = 5, heads = 3, max_position = 64;
  const int dim = heads * kIndexHeadDim;
  const int64_t ld = dim + 40, ld8 = dim + 16;
  const auto table = rope_table(max_position, kRopeDim);
  std::vector<int32_t> positions(rows);
  for (int r = 0; r < rows; ++r) positions[r] = int32_t(rng.integer(0, max_position - 1));
  auto x = strided_normals(rng, rows, dim, ld, 3.0f);
  x[size_t(2 * ld + kIndexHeadDim + 5)] = 1e-6f;  // a head with tiny values: the 1e-4 amax floor
  for (int i = 0; i < kIndexHeadDim; ++i) x[size_t(2 * ld + kIndexHeadDim + i)] *= 1e-7f;
  std::unique_ptr<Backend> be = make_cpu_backend();
  auto plain = x, encoded = x;
  be->indexer_query({plain.data(), ld, rows, heads, positions.data(), table.data(), max_position,
                     RopeStyle::kHalfSplit, 0.125f});
  std::vector<uint8_t> q8(size_t(rows) * ld8, 0xA5);
  std::vector<float> scales(size_t(rows) * heads, -1.0f);
  IndexerQueryParams p{
      encoded.data(),        ld,    rows, heads, positions.data(), table.data(), max_position,
      RopeStyle::kHalfSplit, 0.125f};
  p.q_fp8 = q8.data();
  p.q_fp8_scale = scales.data();
  p.ld_q_fp8 = ld8;
  be->indexer_query(p);
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_TRUE(same_bits(plain[i], encoded[i])) << i;
  std::vector<Fp8E4M3> want(kIndexHeadDim);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const float s = encode_fp8_group(plain.data() + r * ld + h * kIndexHeadDim, kIndexHeadDim,
                                       want.data(), ScaleRounding::kExact);
      EXPECT_TRUE(same_bits(scales[size_t(r * heads + h)], s)) << "row " << r << " head " << h;
      EXPECT_GT(s, 0.0f);
      for (int d = 0; d < kIndexHeadDim; ++d) {
        EXPECT_EQ(q8[size_t(r * ld8 + h * kIndexHeadDim + d)], want[size_t(d)].bits)
            << "row " << r << " head " << h << " dim " << d;
      }
    }
    for (int64_t c = dim; c < ld8; ++c) EXPECT_EQ(q8[size_t(r * ld8 + c)], 0xA5) << "row " << r;
  }
  // The tiny head's scale is the floor's; a row's bytes are not all zero.
  EXPECT_TRUE(same_bits(scales[size_t(2 * heads + 1)], 1e-4f / 448.0f));
  EXPECT_NE(std::count(q8.begin(), q8.begin() + dim, uint8_t(0)), dim);
  // Without scales, or with too short a row stride, it is refused.
  p.q_fp8_scale = nullptr;
  EXPECT_THROW(be->indexer_query(p), Error);
  p.q_fp8_scale = scales.data();
  p.ld_q_fp8 = dim - 1;
  EXPECT_THROW(be->indexer_query(p), Error);
}

// ---- SwiGLU, softmax, embed, add ---------------------------------------------------------------

TEST(OpsSwiglu, MatchesFloat64) {
  Rng rng(12);
  const int rows = 4, inter = 300;
  const int64_t ld_in = 2 * inter + 3, ld_out = inter + 5;
  auto gate_up = strided_normals(rng, rows, 2 * inter, ld_in, 4.0f);
  gate_up[0] = -100.0f, gate_up[1] = 100.0f, gate_up[2] = -30.0f;  // exp overflow / saturation
  auto out = poisoned(size_t(rows * ld_out));
  cpu::swiglu({.gate_up = gate_up.data(),
               .out = out.data(),
               .rows = rows,
               .inter = inter,
               .ld_in = ld_in,
               .ld_out = ld_out});
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < inter; ++i) {
      const double g = gate_up[size_t(r * ld_in + i)], u = gate_up[size_t(r * ld_in + inter + i)];
      const double ref = g / (1.0 + std::exp(-g)) * u;
      // expf errs < 1 ulp and its error is not amplified (g itself is exact); then the add,
      // division and product round once each: 8u relative. The absolute floor covers results
      // below f32's normal range, where exp(-g) overflows and the op returns a signed zero.
      ASSERT_NEAR(out[size_t(r * ld_out + i)], ref, 8 * kU * std::fabs(ref) + 1e-37)
          << "row " << r << " g " << g;
    }
  }
  expect_padding_untouched(out, rows, inter, ld_out);
  expect_batch_invariant(rows, ld_out, [&](int first, int count) {
    auto y = poisoned(out.size());
    cpu::swiglu({.gate_up = gate_up.data() + first * ld_in,
                 .out = y.data() + first * ld_out,
                 .rows = count,
                 .inter = inter,
                 .ld_in = ld_in,
                 .ld_out = ld_out});
    return y;
  });
}

TEST(OpsSoftmax, MatchesFloat64) {
  Rng rng(13);
  const float inf = std::numeric_limits<float>::infinity();
  for (int cols : {1, 100, 2048}) {
    const int rows = 4;
    const int64_t ld = cols + 3;
    auto x = strided_normals(rng, rows, cols, ld, 4.0f);
    x[size_t(2 * ld)] = -inf;                                     // a masked entry
    for (int i = 0; i < cols; ++i) x[size_t(3 * ld + i)] = -inf;  // a fully masked row
    auto out = x;
    cpu::softmax({.x = out.data(), .rows = rows, .cols = cols, .ld = ld});
    for (int r = 0; r < rows; ++r) {
      const float* xr = &x[size_t(r * ld)];
      double max = -INFINITY, sum = 0, out_sum = 0;
      for (int i = 0; i < cols; ++i) max = std::max(max, double(xr[i]));
      double max_dev = 0;
      for (int i = 0; i < cols; ++i) {
        sum += std::exp(xr[i] - max);
        if (std::isfinite(xr[i])) max_dev = std::max(max_dev, max - xr[i]);
      }
      for (int i = 0; i < cols; ++i) {
        const float got = out[size_t(r * ld + i)];
        out_sum += got;
        if (max == -INFINITY) {  // every entry masked: no distribution, zeros, never NaN
          ASSERT_TRUE(same_bits(got, 0.0f)) << "col " << i;
          continue;
        }
        if (xr[i] == -INFINITY) {  // a masked entry gets exactly zero
          ASSERT_TRUE(same_bits(got, 0.0f)) << "col " << i;
          continue;
        }
        const double ref = std::exp(xr[i] - max) / sum;
        // x - max rounds by u|x - max|, which expf turns into that relative error; each term
        // then errs by up to (max_dev + 1)u and the ascending sum adds (cols - 1)u, the division
        // one more u.
        const double tol = (std::fabs(xr[i] - max) + max_dev + cols + 4) * kU * ref;
        ASSERT_NEAR(got, ref, tol) << "cols " << cols << " row " << r << " col " << i;
      }
      if (max != -INFINITY) {
        EXPECT_NEAR(out_sum, 1.0, (2 * cols + 2 * max_dev + 8) * kU);
      }
    }
    expect_padding_untouched(out, rows, cols, ld);
    expect_batch_invariant(rows, ld, [&](int first, int count) {
      auto y = x;
      cpu::softmax({.x = y.data() + first * ld, .rows = count, .cols = cols, .ld = ld});
      return y;
    });
  }
}

TEST(OpsEmbed, CopiesRowsAndZeroesOutOfRangeTokens) {
  Rng rng(14);
  const int vocab = 50, dim = 70;
  const int64_t ld = dim + 3;
  const auto table = rng.bf16s(size_t(vocab * dim));
  const std::vector<int32_t> tokens = {
      int32_t(rng.integer(1, 48)),         0, 49, -1, 50, std::numeric_limits<int32_t>::max(),
      std::numeric_limits<int32_t>::min(), 7};
  const int rows = int(tokens.size());
  auto run = [&](int first, int count) {
    auto y = poisoned(size_t(rows * ld));
    cpu::embed({.tokens = tokens.data() + first,
                .table = table.data(),
                .out = y.data() + first * ld,
                .rows = count,
                .vocab = vocab,
                .dim = dim,
                .ld_out = ld});
    return y;
  };
  const auto out = run(0, rows);
  for (int r = 0; r < rows; ++r) {
    const int32_t t = tokens[size_t(r)];
    for (int i = 0; i < dim; ++i) {
      const float want = t >= 0 && t < vocab ? bf16_to_float(table[size_t(t * dim + i)]) : 0.0f;
      ASSERT_TRUE(same_bits(out[size_t(r * ld + i)], want)) << "row " << r << " col " << i;
    }
  }
  expect_padding_untouched(out, rows, dim, ld);
  expect_batch_invariant(rows, ld, run);
}

TEST(OpsAdd, ExactSumAndAliasing) {
  Rng rng(15);
  const int rows = 3, dim = 129;
  const int64_t ld_x = dim + 2, ld_y = dim + 4;
  const auto x = strided_normals(rng, rows, dim, ld_x);
  const auto y0 = strided_normals(rng, rows, dim, ld_y, 3.0f);
  auto y = y0;
  cpu::add({.x = x.data(), .y = y.data(), .rows = rows, .dim = dim, .ld_x = ld_x, .ld_y = ld_y});
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) {
      // One f32 add is the correctly rounded sum, which float64 then rounding reproduces exactly.
      const float want = float(double(y0[size_t(r * ld_y + i)]) + x[size_t(r * ld_x + i)]);
      ASSERT_TRUE(same_bits(y[size_t(r * ld_y + i)], want)) << "row " << r << " col " << i;
    }
  }
  expect_padding_untouched(y, rows, dim, ld_y);
  // x aliasing y doubles y exactly.
  auto twice = y0;
  cpu::add(
      {.x = twice.data(), .y = twice.data(), .rows = rows, .dim = dim, .ld_x = ld_y, .ld_y = ld_y});
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) {
      ASSERT_TRUE(same_bits(twice[size_t(r * ld_y + i)], 2 * y0[size_t(r * ld_y + i)]));
    }
  }
  expect_batch_invariant(rows, ld_y, [&](int first, int count) {
    auto out = y0;
    cpu::add({.x = x.data() + first * ld_x,
              .y = out.data() + first * ld_y,
              .rows = count,
              .dim = dim,
              .ld_x = ld_x,
              .ld_y = ld_y});
    return out;
  });
}

}  // namespace
}  // namespace dsa
