// The sampler: greedy, the top-p nucleus's mass boundaries, temperature -> 0, seeded determinism
// and parameter checks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "common/test_util.h"
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

}  // namespace
}  // namespace dsa
