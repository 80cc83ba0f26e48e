#include "dsa/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsa/error.h"
#include "dsa/generate.h"

namespace dsa {

void SamplingParams::validate() const {
  require(std::isfinite(temperature) && temperature >= 0.0f, ErrorCode::kInvalidArgument,
          "temperature = {} must be a finite number >= 0 (0 means greedy)", temperature);
  require(top_p > 0.0f && top_p <= 1.0f, ErrorCode::kInvalidArgument,
          "top_p = {} must be in (0, 1]", top_p);
}

double sample_uniform(uint64_t seed, uint64_t index) {
  // splitmix64 over a key mixing both inputs; the top 53 bits make the double.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

Nucleus nucleus(std::span<const float> logits, const SamplingParams& params) {
  params.validate();
  require(params.temperature > 0.0f, ErrorCode::kInvalidArgument,
          "a nucleus needs temperature > 0, got {}", params.temperature);
  Nucleus n;
  const int32_t best = argmax(logits);  // throws when every logit is NaN
  const double top = logits[size_t(best)];
  if (std::isinf(top)) {  // +inf (or every logit -inf): the distribution is that one token
    n.tokens = {best};
    n.probs = {1.0};
    n.mass = 1.0;
    return n;
  }
  // Weights relative to the largest logit, in float64: exp((l - max) / T) is in (0, 1].
  std::vector<double> weight(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    weight[i] = std::exp((double(logits[i]) - top) / double(params.temperature));
    total += weight[i];
  }
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return weight[size_t(a)] > weight[size_t(b)]; });
  // The cut allows a relative 1e-12 of rounding, so a nucleus whose exact mass is top_p stops
  // there rather than taking one more token.
  const double target = double(params.top_p) - 1e-12;
  for (int32_t id : order) {
    const double p = weight[size_t(id)] / total;
    if (p == 0.0 || std::isnan(logits[size_t(id)])) break;
    n.tokens.push_back(id);
    n.probs.push_back(p);
    n.mass += p;
    if (n.mass >= target) break;
  }
  return n;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t index) {
  if (params.greedy()) return argmax(logits);
  const Nucleus n = nucleus(logits, params);
  const double target = sample_uniform(params.seed, index) * n.mass;
  double cumulative = 0;
  for (size_t i = 0; i < n.tokens.size(); ++i) {
    cumulative += n.probs[i];
    if (target < cumulative) return n.tokens[i];
  }
  return n.tokens.back();  // target rounded up to the whole mass
}

}  // namespace dsa
