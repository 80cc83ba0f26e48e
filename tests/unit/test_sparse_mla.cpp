// Absorbed sparse MLA decode (DESIGN §1.7) against a float64 reference on the same decoded cache
// values and the same bf16-rounded query, for bf16 and fp8 latent pools. Index lists mix valid
// slots with -1 and out-of-range entries, and padded rows must come out exactly 0 with lse -inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "common/test_util.h"
#include "dsa/token_codec.h"

namespace dsa {
namespace {

using testing::kPoison;
using testing::Rng;

constexpr float kSoftmaxScale = 0.07216878f;  // (128 + 64)^-1/2

// What each row's index list holds.
enum class RowKind {
  kValid,     // distinct valid slots only
  kMixed,     // valid slots among -1 and out-of-range entries (and a reserved-page slot)
  kPadded,    // all -1
  kGarbage,   // no valid slot: only out-of-range and negative entries
  kSingle,    // one valid slot, the rest -1
  kRepeated,  // a few valid slots, each chosen many times
};

struct MlaFixture {
  std::vector<uint8_t> bytes;
  PoolView pool;
  std::vector<int64_t> indices;  // [rows, ld_indices]
  std::vector<float> q;          // [rows, ld_q]
  int rows = 0, heads = 0, topk = 0;
  int64_t ld_q = 0, ld_indices = 0, ld_out = 0;
  float scale = kSoftmaxScale;

  MlaFixture(KvDtype dtype, int n_heads, int top, const std::vector<RowKind>& kinds, uint64_t seed)
      : rows(int(kinds.size())), heads(n_heads), topk(top) {
    Rng rng(seed);
    pool.dtype = dtype;
    pool.num_pages = 40;
    bytes.assign(size_t(pool.num_pages * latent_page_bytes(dtype)), 0);
    pool.data = bytes.data();
    std::vector<float> c(kKvLoraRank), rope(kRopeDim);
    for (int64_t slot = kPageSize; slot < pool.capacity(); ++slot) {
      for (float& v : c) v = rng.normal();
      for (float& v : rope) v = rng.normal();
      encode_latent_token(pool, slot, c.data(), rope.data());
    }
    ld_indices = topk + 3;
    indices.assign(size_t(rows * ld_indices), int64_t(1) << 40);  // slack: never read
    for (int r = 0; r < rows; ++r) fill_row(kinds[size_t(r)], indices.data() + r * ld_indices, rng);
    ld_q = int64_t(heads) * kLatentDim + 4;
    ld_out = int64_t(heads) * kKvLoraRank + 6;
    q = rng.normals(size_t(rows * ld_q));
  }

  int64_t random_slot(Rng& rng) const { return rng.integer(kPageSize, pool.capacity() - 1); }

  void fill_row(RowKind kind, int64_t* row, Rng& rng) const {
    const int64_t cap = pool.capacity();
    const int64_t garbage[] = {cap, cap + 1000, -2, INT64_MIN, -kPageSize};
    std::vector<int64_t> pool_slots;
    for (int64_t s = kPageSize; s < cap; ++s) pool_slots.push_back(s);
    std::shuffle(pool_slots.begin(), pool_slots.end(), rng.gen());
    for (int j = 0; j < topk; ++j) {
      switch (kind) {
        case RowKind::kValid:
          row[j] = pool_slots[size_t(j)];
          break;
        case RowKind::kMixed: {
          const int64_t pick = rng.integer(0, 9);
          row[j] = pick < 6 ? pool_slots[size_t(j)] : pick < 8 ? kPadSlot : garbage[pick % 5];
          break;
        }
        case RowKind::kPadded:
          row[j] = kPadSlot;
          break;
        case RowKind::kGarbage:
          row[j] = garbage[j % 5];
          break;
        case RowKind::kSingle:
          row[j] = j == topk / 2 ? random_slot(rng) : kPadSlot;
          break;
        case RowKind::kRepeated:
          row[j] = pool_slots[size_t(j % 3)];
          break;
      }
    }
    if (kind == RowKind::kMixed) row[1] = 5;  // a slot in the reserved page: valid, reads zeros
  }

  SparseMlaParams params(float* out, float* lse) const {
    SparseMlaParams p;
    p.q = q.data();
    p.indices = indices.data();
    p.out = out;
    p.lse = lse;
    p.pool = pool;
    p.rows = rows;
    p.heads = heads;
    p.topk = topk;
    p.ld_q = ld_q;
    p.ld_indices = ld_indices;
    p.ld_out = ld_out;
    p.scale = scale;
    return p;
  }

  struct Result {
    std::vector<float> out, lse;
  };
  Result run() const {
    Result res{std::vector<float>(size_t(rows * ld_out), kPoison),
               std::vector<float>(size_t(rows * heads), kPoison)};
    cpu::sparse_mla(params(res.out.data(), res.lse.data()));
    return res;
  }
};

struct HeadReference {
  std::vector<double> out;  // [512]
  double lse = -INFINITY;
  double max_score = -INFINITY;
  double second_score = -INFINITY;  // the runner-up, to know how one-hot the softmax is
  int64_t argmax_slot = -1;
};

// Float64 softmax attention over the valid entries, on the op's own inputs: bf16(q) and the
// decoded cache values.
HeadReference reference_head(const MlaFixture& f, int r, int h) {
  const float* q = f.q.data() + r * f.ld_q + h * kLatentDim;
  const int64_t* idx = f.indices.data() + r * f.ld_indices;
  std::vector<std::vector<double>> tokens;
  std::vector<double> scores;
  std::vector<float> token(kLatentDim);
  HeadReference ref;
  for (int j = 0; j < f.topk; ++j) {
    if (idx[j] < 0 || idx[j] >= f.pool.capacity()) continue;
    decode_latent_token(f.pool, idx[j], token.data());
    double dot = 0;
    for (int d = 0; d < kLatentDim; ++d) dot += double(round_bf16(q[d])) * token[size_t(d)];
    const double s = double(f.scale) * dot;
    if (s > ref.max_score) {
      ref.second_score = ref.max_score;
      ref.max_score = s;
      ref.argmax_slot = idx[j];
    } else {
      ref.second_score = std::max(ref.second_score, s);
    }
    scores.push_back(s);
    tokens.emplace_back(token.begin(), token.begin() + kKvLoraRank);
  }
  ref.out.assign(kKvLoraRank, 0.0);
  if (scores.empty()) return ref;
  double sum = 0;
  for (size_t j = 0; j < scores.size(); ++j) {
    const double e = std::exp(scores[j] - ref.max_score);
    sum += e;
    for (int d = 0; d < kKvLoraRank; ++d) ref.out[size_t(d)] += e * tokens[j][size_t(d)];
  }
  for (double& v : ref.out) v /= sum;
  ref.lse = ref.max_score + std::log(sum);
  return ref;
}

std::vector<double> out_head(const MlaFixture& f, const MlaFixture::Result& res, int r, int h) {
  const float* o = res.out.data() + r * f.ld_out + h * kKvLoraRank;
  return std::vector<double>(o, o + kKvLoraRank);
}

// Exactly +0.0f in all 512 outputs (bits, so -0 and NaN fail too) and lse = -inf.
void expect_exact_zero(const MlaFixture& f, const MlaFixture::Result& res, int r) {
  for (int h = 0; h < f.heads; ++h) {
    const float* o = res.out.data() + r * f.ld_out + h * kKvLoraRank;
    for (int d = 0; d < kKvLoraRank; ++d) {
      uint32_t bits;
      std::memcpy(&bits, o + d, 4);
      ASSERT_EQ(bits, 0u) << "row " << r << " head " << h << " dim " << d << ": " << o[d];
    }
    EXPECT_EQ(res.lse[size_t(r * f.heads + h)], -std::numeric_limits<float>::infinity());
  }
}

// out within out_tol (relative, per head), lse within lse_tol (absolute).
void expect_matches_reference(const MlaFixture& f, const MlaFixture::Result& res, double out_tol,
                              double lse_tol) {
  for (int r = 0; r < f.rows; ++r) {
    for (int h = 0; h < f.heads; ++h) {
      const HeadReference ref = reference_head(f, r, h);
      if (ref.argmax_slot < 0) {
        expect_exact_zero(f, res, r);
        break;
      }
      EXPECT_LE(testing::rel_error(out_head(f, res, r, h), ref.out), out_tol)
          << "row " << r << " head " << h;
      const double lse = res.lse[size_t(r * f.heads + h)];
      EXPECT_NEAR(lse, ref.lse, lse_tol) << "row " << r << " head " << h;
    }
  }
}

const std::vector<RowKind> kAllKinds = {RowKind::kValid,   RowKind::kMixed,  RowKind::kPadded,
                                        RowKind::kGarbage, RowKind::kSingle, RowKind::kRepeated};

class SparseMlaDtype : public ::testing::TestWithParam<KvDtype> {};

TEST_P(SparseMlaDtype, MatchesFloat64Reference) {
  const MlaFixture f(GetParam(), 16, 128, kAllKinds, 301);
  expect_matches_reference(f, f.run(), 1e-5, 1e-5);
}

TEST_P(SparseMlaDtype, FullIndexTopk) {
  const MlaFixture f(GetParam(), 4, 2048, {RowKind::kValid, RowKind::kMixed}, 302);
  expect_matches_reference(f, f.run(), 1e-5, 1e-5);
}

TEST_P(SparseMlaDtype, PaddedRowsAreExactlyZero) {
  const MlaFixture f(GetParam(), 8, 64, {RowKind::kPadded, RowKind::kGarbage}, 303);
  const MlaFixture::Result res = f.run();
  expect_exact_zero(f, res, 0);
  expect_exact_zero(f, res, 1);
}

// One valid slot: the softmax is exactly 1, so the output is that token's latent, bit for bit.
TEST_P(SparseMlaDtype, SingleSlotReturnsItsLatent) {
  const MlaFixture f(GetParam(), 8, 32, {RowKind::kSingle}, 304);
  const MlaFixture::Result res = f.run();
  std::vector<float> token(kLatentDim);
  decode_latent_token(f.pool, f.indices[16], token.data());
  for (int h = 0; h < f.heads; ++h) {
    EXPECT_EQ(std::memcmp(res.out.data() + h * kKvLoraRank, token.data(), kKvLoraRank * 4), 0);
    EXPECT_NEAR(res.lse[size_t(h)], reference_head(f, 0, h).lse, 1e-5);
  }
}

// Scores around +-1e31 overflow exp() many times over without the max subtraction. With it, the
// softmax is one-hot on the best slot: out is that slot's latent exactly and lse its score.
TEST_P(SparseMlaDtype, ExtremeScoresStayFinite) {
  for (float scale : {1e30f, -1e30f}) {
    MlaFixture f(GetParam(), 8, 64, {RowKind::kValid, RowKind::kMixed}, 305);
    f.scale = scale;
    const MlaFixture::Result res = f.run();
    std::vector<float> token(kLatentDim);
    for (int r = 0; r < f.rows; ++r) {
      for (int h = 0; h < f.heads; ++h) {
        const HeadReference ref = reference_head(f, r, h);
        ASSERT_GT(ref.max_score - ref.second_score, 1e-5 * std::abs(ref.max_score));
        decode_latent_token(f.pool, ref.argmax_slot, token.data());
        const float* o = res.out.data() + r * f.ld_out + h * kKvLoraRank;
        EXPECT_EQ(std::memcmp(o, token.data(), kKvLoraRank * 4), 0) << "row " << r << " head " << h;
        const float lse = res.lse[size_t(r * f.heads + h)];
        EXPECT_TRUE(std::isfinite(lse));
        EXPECT_NEAR(lse, ref.lse, 1e-5 * std::abs(ref.lse));
      }
    }
  }
}

// Scores near +-4600 with an ordinary spread: every key's rope part is all ones and every
// q_rope is +-1000, which adds a common +-64000 (exact in f32) to each dot. exp() of such a score
// overflows or underflows f32, yet the softmax is far from one-hot. An f32 score near 4600 has an
// ulp of 5e-4, so the weights carry up to ~2.5e-4 of relative rounding: out's bound is 1e-3, and
// lse's 5e-3 (ten ulps).
TEST_P(SparseMlaDtype, LargeScoreOffsetsMatchReference) {
  for (float q_rope : {1000.0f, -1000.0f}) {
    MlaFixture f(GetParam(), 8, 128, {RowKind::kValid, RowKind::kMixed}, 306);
    std::vector<float> token(kLatentDim);
    for (int64_t slot = kPageSize; slot < f.pool.capacity(); ++slot) {
      decode_latent_token(f.pool, slot, token.data());
      std::fill(token.begin() + kKvLoraRank, token.end(), 1.0f);
      encode_latent_token(f.pool, slot, token.data(), token.data() + kKvLoraRank);
    }
    for (int r = 0; r < f.rows; ++r) {
      for (int h = 0; h < f.heads; ++h) {
        float* q = f.q.data() + r * f.ld_q + h * kLatentDim;
        std::fill(q + kKvLoraRank, q + kLatentDim, q_rope);
      }
    }
    const MlaFixture::Result res = f.run();
    const HeadReference ref = reference_head(f, 0, 0);
    ASSERT_GT(std::abs(ref.max_score), 4000.0);
    ASSERT_LT(ref.max_score - ref.second_score, 5.0);  // not one-hot
    for (float v : res.out) EXPECT_FALSE(std::isinf(v));
    expect_matches_reference(f, res, 1e-3, 5e-3);
  }
}

// Each row of a batch equals, bit for bit, that row run alone.
TEST_P(SparseMlaDtype, BatchInvariant) {
  const MlaFixture f(GetParam(), 4, 96, kAllKinds, 307);
  const MlaFixture::Result batch = f.run();
  for (int r = 0; r < f.rows; ++r) {
    std::vector<float> out(size_t(f.ld_out), kPoison), lse(size_t(f.heads), kPoison);
    SparseMlaParams p = f.params(out.data(), lse.data());
    p.rows = 1;
    p.q += r * f.ld_q;
    p.indices += r * f.ld_indices;
    cpu::sparse_mla(p);
    EXPECT_EQ(std::memcmp(out.data(), batch.out.data() + r * f.ld_out, f.heads * kKvLoraRank * 4),
              0)
        << "row " << r;
    EXPECT_EQ(std::memcmp(lse.data(), batch.lse.data() + r * f.heads, f.heads * 4), 0);
  }
}

TEST(SparseMla, LseIsOptional) {
  const MlaFixture f(KvDtype::kBf16, 4, 64, {RowKind::kMixed, RowKind::kPadded}, 308);
  std::vector<float> out(size_t(f.rows * f.ld_out), kPoison);
  cpu::sparse_mla(f.params(out.data(), nullptr));
  const MlaFixture::Result with_lse = f.run();
  for (int r = 0; r < f.rows; ++r) {
    EXPECT_EQ(std::memcmp(out.data() + r * f.ld_out, with_lse.out.data() + r * f.ld_out,
                          f.heads * kKvLoraRank * 4),
              0);
  }
}

INSTANTIATE_TEST_SUITE_P(SparseMla, SparseMlaDtype,
                         ::testing::Values(KvDtype::kBf16, KvDtype::kFp8),
                         [](const ::testing::TestParamInfo<KvDtype>& param_info) {
                           return std::string(kv_dtype_name(param_info.param));
                         });

}  // namespace
}  // namespace dsa
