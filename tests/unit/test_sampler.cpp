// The sampler: greedy, the top-p nucleus's mass boundaries, temperature -> 0, seeded determinism,
// parameter checks, the shared exp, and the backend op against the per-row reference.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "common/test_util.h"
#include "dsa/backend.h"
#include "dsa/error.h"
#include "dsa/generate.h"
#include "dsa/sampler.h"

namespace dsa {
namespace {

using testing::Rng;

// Logits whose softmax at temperature 1 is exactly proportional to `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

TEST(Sampler, GreedyIsArgmaxWithTiesToTheLowerId) {
  Rng rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits = rng.normals(256);
    const SamplingParams greedy;
    EXPECT_EQ(sample_token(logits, greedy, uint64_t(trial)), argmax(logits));
  }
  std::vector<float> tie = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sample_token(tie, SamplingParams{}, 0), 1);
  tie[1] = std::nanf("");
  EXPECT_EQ(sample_token(tie, SamplingParams{}, 0), 3);  // NaN never wins
}

TEST(Sampler, NucleusStopsAtTheFirstPrefixReachingTopP) {
  const std::vector<float> logits = logits_of({0.1, 0.5, 0.25, 0.15});  // order: 1, 2, 3, 0
  auto tokens = [&](float top_p) { return nucleus(logits, SamplingParams{1.0f, top_p, 0}).tokens; };
  EXPECT_EQ(tokens(0.2f), (std::vector<int32_t>{1}));
  EXPECT_EQ(tokens(0.5f), (std::vector<int32_t>{1}));  // exactly the first token's mass
  EXPECT_EQ(tokens(0.51f), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(tokens(0.75f), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(tokens(0.76f), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(tokens(1.0f), (std::vector<int32_t>{1, 2, 3, 0}));
  const Nucleus n = nucleus(logits, SamplingParams{1.0f, 0.75f, 0});
  EXPECT_NEAR(n.mass, 0.75, 1e-6);
  EXPECT_NEAR(n.probs[0], 0.5, 1e-6);
}

TEST(Sampler, DrawsStayInsideTheNucleusAndFollowItsMass) {
  const std::vector<float> logits = logits_of({0.1, 0.5, 0.25, 0.15});
  const SamplingParams p{1.0f, 0.75f, 1234};
  std::map<int32_t, int> counts;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++counts[sample_token(logits, p, uint64_t(i))];
  EXPECT_EQ(counts.count(0), 0u);
  EXPECT_EQ(counts.count(3), 0u);
  // Inside the nucleus the odds are 0.5 : 0.25, so token 1 takes 2/3 of the draws.
  EXPECT_NEAR(double(counts[1]) / draws, 2.0 / 3.0, 0.02);
}

TEST(Sampler, TemperatureTowardZeroApproachesGreedy) {
  Rng rng(12);
  for (int trial = 0; trial < 10; ++trial) {
    const std::vector<float> logits = rng.normals(256, 2.0f);
    const int32_t best = argmax(logits);
    int hits_hot = 0, hits_cold = 0;
    for (int i = 0; i < 200; ++i) {
      hits_hot += sample_token(logits, {2.0f, 1.0f, uint64_t(trial)}, uint64_t(i)) == best;
      hits_cold += sample_token(logits, {1e-4f, 1.0f, uint64_t(trial)}, uint64_t(i)) == best;
    }
    EXPECT_EQ(hits_cold, 200);
    EXPECT_LT(hits_hot, 200);
    const Nucleus cold = nucleus(logits, {1e-4f, 0.99f, 0});
    EXPECT_EQ(cold.tokens, (std::vector<int32_t>{best}));
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  Rng rng(13);
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < 64; ++i) steps.push_back(rng.normals(256));
  auto run = [&](uint64_t seed) {
    std::vector<int32_t> out;
    for (size_t i = 0; i < steps.size(); ++i) {
      out.push_back(sample_token(steps[i], {0.8f, 0.95f, seed}, i));
    }
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
  // A draw depends on its index, not on what ran before it.
  EXPECT_EQ(sample_token(steps[40], {0.8f, 0.95f, 7}, 40), run(7)[40]);
}

TEST(Sampler, UniformStreamIsInUnitIntervalAndVaries) {
  double lo = 1, hi = 0, sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = sample_uniform(99, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
  }
  EXPECT_LT(lo, 0.01);
  EXPECT_GT(hi, 0.99);
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(Sampler, BadParametersAreRejectedByName) {
  const std::vector<float> logits = {1.0f, 2.0f};
  auto message = [&](SamplingParams p) {
    try {
      sample_token(logits, p, 0);
      p.validate();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({-0.5f, 1.0f, 0}).find("temperature = -0.5"), std::string::npos);
  EXPECT_NE(message({std::nanf(""), 1.0f, 0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({1.0f, 0.0f, 0}).find("top_p = 0"), std::string::npos);
  EXPECT_NE(message({1.0f, 1.5f, 0}).find("top_p = 1.5"), std::string::npos);
  EXPECT_NE(message({0.0f, -1.0f, 0}).find("top_p"), std::string::npos);  // greedy validates too
  EXPECT_EQ(message({0.7f, 0.9f, 0}), "");
}

TEST(Sampler, SharedExpMatchesLibm) {
  for (double x = -40.0; x <= 0.0; x += 0.0137) {
    EXPECT_NEAR(sample_exp(x) / std::exp(x), 1.0, 4e-15) << "x = " << x;
  }
  EXPECT_EQ(sample_exp(0.0), 1.0);
  EXPECT_EQ(sample_exp(-INFINITY), 0.0);
  EXPECT_EQ(sample_exp(std::nan("")), 0.0);
}

TEST(Sampler, TiesAtTheCutAllJoinTheNucleus) {
  const std::vector<float> logits = {0.0f, 1.0f, 1.0f, 1.0f, -3.0f};
  EXPECT_EQ(nucleus(logits, {1.0f, 0.3f, 0}).tokens, (std::vector<int32_t>{1, 2, 3}));
  std::map<int32_t, int> counts;
  for (int i = 0; i < 3000; ++i) ++counts[sample_token(logits, {1.0f, 0.3f, 5}, uint64_t(i))];
  EXPECT_EQ(counts.size(), 3u);  // each tied token is drawn, nothing else
  for (int32_t id : {1, 2, 3}) EXPECT_NEAR(counts[id] / 3000.0, 1.0 / 3, 0.04);
}

TEST(Sampler, BackendOpDrawsTheReferenceTokensAndLogprobs) {
  auto be = make_cpu_backend();
  Rng rng(14);
  const int rows = 9, vocab = 300;
  std::vector<float> logits = rng.normals(size_t(rows) * vocab, 2.0f);
  std::vector<float> temperature(rows), top_p(rows), logprobs(rows);
  std::vector<uint64_t> seed(rows), index(rows);
  std::vector<int32_t> tokens(rows, -7);
  for (int r = 0; r < rows; ++r) {
    temperature[r] = r % 3 == 0 ? 0.0f : rng.uniform(0.2f, 1.5f);
    top_p[r] = r % 4 == 0 ? 1.0f : rng.uniform(0.1f, 0.95f);
    seed[r] = uint64_t(rng.integer(0, 1 << 30));
    index[r] = uint64_t(r * 17);
  }
  for (int i = 0; i < vocab; ++i) logits[size_t(8) * vocab + i] = std::nanf("");  // no token
  SampleParams p{logits.data(), temperature.data(), top_p.data(), seed.data(), index.data(),
                 tokens.data(), logprobs.data(),    nullptr,      rows,        vocab,
                 vocab};
  be->sample(p);
  for (int r = 0; r < rows - 1; ++r) {
    const std::span<const float> row(logits.data() + size_t(r) * vocab, size_t(vocab));
    EXPECT_EQ(tokens[r], sample_token(row, {temperature[r], top_p[r], seed[r]}, index[r]));
    double sum = 0;
    for (float l : row) sum += std::exp(double(l));
    EXPECT_NEAR(logprobs[r], std::log(std::exp(double(row[size_t(tokens[r])])) / sum), 1e-6);
  }
  EXPECT_EQ(tokens[rows - 1], -1);
  EXPECT_TRUE(std::isnan(logprobs[rows - 1]));
  const std::span<const float> nans(logits.data() + size_t(rows - 1) * vocab, size_t(vocab));
  EXPECT_THROW(sample_token(nans, {0.7f, 0.9f, 1}, 0), Error);
}

}  // namespace
}  // namespace dsa
