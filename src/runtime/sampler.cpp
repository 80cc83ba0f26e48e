#include "dsa/sampler.h"

#include <algorithm>
#include <cmath>

#include "dsa/error.h"

namespace dsa {

void SamplingParams::validate() const {
  require(std::isfinite(temperature) && temperature >= 0.0f, ErrorCode::kInvalidArgument,
          "temperature = {} must be a finite number >= 0 (0 means greedy)", temperature);
  require(top_p > 0.0f && top_p <= 1.0f, ErrorCode::kInvalidArgument,
          "top_p = {} must be in (0, 1]", top_p);
}

Nucleus nucleus(std::span<const float> logits, const SamplingParams& params) {
  params.validate();
  require(params.temperature > 0.0f, ErrorCode::kInvalidArgument,
          "a nucleus needs temperature > 0, got {}", params.temperature);
  std::vector<uint32_t> weight(logits.size());
  const SampleDraw d = sample_row(logits.data(), int(logits.size()), params.temperature,
                                  params.top_p, params.seed, 0, false, weight.data());
  require(d.best >= 0, ErrorCode::kInternal, "every one of {} logits is NaN", logits.size());
  Nucleus n;
  if (d.total == 0) {  // an infinite top: the distribution is that one token
    n.tokens = {d.best};
    n.probs = {1.0};
    n.mass = 1.0;
    return n;
  }
  for (size_t i = 0; i < weight.size(); ++i) {
    if (weight[i] >= d.cut) n.tokens.push_back(int32_t(i));
  }
  std::stable_sort(n.tokens.begin(), n.tokens.end(),
                   [&](int32_t a, int32_t b) { return weight[size_t(a)] > weight[size_t(b)]; });
  for (int32_t id : n.tokens) n.probs.push_back(double(weight[size_t(id)]) / double(d.total));
  n.mass = double(d.mass) / double(d.total);
  return n;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t index) {
  params.validate();
  const SampleDraw d = sample_row(logits.data(), int(logits.size()), params.temperature,
                                  params.top_p, params.seed, index, false);
  require(d.token >= 0, ErrorCode::kInternal, "every one of {} logits is NaN", logits.size());
  return d.token;
}

}  // namespace dsa
