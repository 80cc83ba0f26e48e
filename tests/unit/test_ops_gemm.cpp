// The CPU GEMM against a float64 reference and against its own defined summation order
// (f32, ascending k, products rounded), for both weight layouts, both output modes, alpha and
// batch > 1. Strided rows and the gaps between batch entries are poisoned and must stay so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/backend.h"
#include "dsa/error.h"
#include "unit/ops_test_helpers.h"

namespace dsa {
namespace {

using ops_testing::expect_batch_invariant;
using ops_testing::kU;
using ops_testing::poisoned;
using ops_testing::same_bits;
using ops_testing::widen;
using testing::kPoison;
using testing::Rng;

// ---- GEMM --------------------------------------------------------------------------------------

struct GemmCase {
  WeightLayout layout;
  GemmOutput output;
  float alpha;
  int batch, m, n, k;
};

class OpsGemm : public ::testing::TestWithParam<GemmCase> {};

// Buffers of one GEMM case: strided rows, and a gap of poison between batch entries.
struct GemmBuffers {
  std::vector<float> x, y0;
  std::vector<Bf16> w;
  GemmParams p;
};

GemmBuffers make_gemm(const GemmCase& c, Rng& rng) {
  GemmBuffers g;
  GemmParams& p = g.p;
  p.m = c.m, p.n = c.n, p.k = c.k, p.batch = c.batch, p.layout = c.layout, p.output = c.output;
  p.alpha = c.alpha;
  p.ld_x = c.k + 3, p.ld_y = c.n + 2;
  const int w_rows = c.layout == WeightLayout::kNK ? c.n : c.k;
  p.ld_w = (c.layout == WeightLayout::kNK ? c.k : c.n) + 5;
  p.batch_stride_x = c.m * p.ld_x + 7, p.batch_stride_y = c.m * p.ld_y + 3;
  p.batch_stride_w = w_rows * p.ld_w + 11;
  g.x = poisoned(size_t(c.batch * p.batch_stride_x));
  g.y0 = poisoned(size_t(c.batch * p.batch_stride_y));
  g.w.assign(size_t(c.batch * p.batch_stride_w), Bf16{0x7FFF});
  for (int b = 0; b < c.batch; ++b) {
    for (int i = 0; i < c.m; ++i) {
      for (int kk = 0; kk < c.k; ++kk)
        g.x[size_t(b * p.batch_stride_x + i * p.ld_x + kk)] = rng.normal();
      // kAccumulate adds to these; kOverwrite must ignore them.
      for (int j = 0; j < c.n; ++j)
        g.y0[size_t(b * p.batch_stride_y + i * p.ld_y + j)] = rng.normal();
    }
    for (int i = 0; i < w_rows; ++i) {
      for (int j = 0; j < p.ld_w - 5; ++j) {
        g.w[size_t(b * p.batch_stride_w + i * p.ld_w + j)] = float_to_bf16(rng.normal(0.2f));
      }
    }
  }
  return g;
}

TEST_P(OpsGemm, MatchesFloat64AndTheDefinedOrder) {
  const GemmCase c = GetParam();
  Rng rng(10);
  GemmBuffers g = make_gemm(c, rng);
  GemmParams p = g.p;
  std::vector<float> y = g.y0;
  p.x = g.x.data(), p.w = g.w.data(), p.y = y.data();
  cpu::gemm(p);
  for (int b = 0; b < c.batch; ++b) {
    for (int i = 0; i < c.m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        const float* xr = &g.x[size_t(b * p.batch_stride_x + i * p.ld_x)];
        auto w_at = [&](int kk) {
          const int64_t at = c.layout == WeightLayout::kNK ? j * p.ld_w + kk : kk * p.ld_w + j;
          return g.w[size_t(b * p.batch_stride_w + at)];
        };
        double ref = 0, mag = 0;
        float spec = 0.0f;  // the order the op defines: f32, ascending k, products rounded
        for (int kk = 0; kk < c.k; ++kk) {
          ref += xr[kk] * widen(w_at(kk));
          mag += std::fabs(xr[kk] * widen(w_at(kk)));
          spec += xr[kk] * bf16_to_float(w_at(kk));
        }
        const size_t at = size_t(b * p.batch_stride_y + i * p.ld_y + j);
        const bool acc = c.output == GemmOutput::kAccumulate;
        const double y0 = acc ? g.y0[at] : 0.0;
        const float spec_y = acc ? g.y0[at] + c.alpha * spec : c.alpha * spec;
        ASSERT_TRUE(same_bits(y[at], spec_y)) << "b " << b << " m " << i << " n " << j;
        // A k-term f32 sum of rounded products errs by (k + 1)u of sum|x w|; alpha and the
        // accumulate add two roundings.
        const double tol = (c.k + 4) * kU * (std::fabs(c.alpha) * mag + std::fabs(y0));
        ASSERT_NEAR(y[at], y0 + c.alpha * ref, tol) << "b " << b << " m " << i << " n " << j;
      }
      for (int64_t j = c.n; j < p.ld_y; ++j) {  // padding columns of y keep their poison
        ASSERT_TRUE(same_bits(y[size_t(b * p.batch_stride_y + i * p.ld_y + j)], kPoison));
      }
    }
    for (int64_t gap = c.m * p.ld_y; gap < p.batch_stride_y; ++gap) {
      ASSERT_TRUE(same_bits(y[size_t(b * p.batch_stride_y + gap)], kPoison));
    }
  }
}

TEST_P(OpsGemm, BatchInvariant) {
  const GemmCase c = GetParam();
  Rng rng(11);
  GemmBuffers g = make_gemm(c, rng);
  for (int b = 0; b < c.batch; ++b) {
    // Rows of batch entry b, run as the whole entry and one row at a time.
    expect_batch_invariant(c.m, g.p.ld_y, [&](int first, int count) {
      std::vector<float> y = g.y0;
      GemmParams p = g.p;
      p.batch = 1, p.m = count;
      p.x = g.x.data() + b * p.batch_stride_x + first * p.ld_x;
      p.w = g.w.data() + b * p.batch_stride_w;
      p.y = y.data() + b * p.batch_stride_y + first * p.ld_y;
      cpu::gemm(p);
      // Entry b's rows, as a [m, ld_y] buffer.
      const auto entry = y.begin() + b * g.p.batch_stride_y;
      return std::vector<float>(entry, entry + c.m * g.p.ld_y);
    });
  }
  // And the whole batched call gives each entry the bits of that entry run alone.
  std::vector<float> all = g.y0, alone = g.y0;
  GemmParams p = g.p;
  p.x = g.x.data(), p.w = g.w.data(), p.y = all.data();
  cpu::gemm(p);
  for (int b = 0; b < c.batch; ++b) {
    GemmParams one = g.p;
    one.batch = 1;
    one.x = g.x.data() + b * one.batch_stride_x, one.w = g.w.data() + b * one.batch_stride_w;
    one.y = alone.data() + b * one.batch_stride_y;
    cpu::gemm(one);
  }
  for (size_t i = 0; i < all.size(); ++i) ASSERT_TRUE(same_bits(all[i], alone[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(
    OpsAllCases, OpsGemm,
    ::testing::Values(GemmCase{WeightLayout::kNK, GemmOutput::kOverwrite, 1.0f, 1, 5, 37, 64},
                      GemmCase{WeightLayout::kNK, GemmOutput::kAccumulate, -0.75f, 3, 6, 48, 257},
                      GemmCase{WeightLayout::kNK, GemmOutput::kOverwrite, 0.5f, 2, 1, 1, 3},
                      GemmCase{WeightLayout::kKN, GemmOutput::kOverwrite, 1.0f, 1, 5, 37, 64},
                      GemmCase{WeightLayout::kKN, GemmOutput::kAccumulate, -0.75f, 3, 6, 530, 33},
                      GemmCase{WeightLayout::kKN, GemmOutput::kAccumulate, 2.0f, 2, 9, 1, 130}));

// The --gemm names: each mode's name parses back to it, anything else is refused by name.
TEST(GemmModeNames, RoundTripAndRefuseUnknown) {
  for (GemmMode mode : {GemmMode::kExact, GemmMode::kBatchInvariant, GemmMode::kFast}) {
    EXPECT_EQ(parse_gemm_mode(gemm_mode_name(mode)), mode);
  }
  EXPECT_EQ(gemm_mode_name(GemmMode::kBatchInvariant), "invariant");
  try {
    parse_gemm_mode("cublas");
    FAIL() << "an unknown gemm mode was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'cublas'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsa
