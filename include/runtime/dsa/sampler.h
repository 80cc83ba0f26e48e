// Token sampling: greedy, or temperature + top-p (nucleus) with a per-request seed.
//
// A draw depends only on (logits, params, index), where index is the position of the token in the
// request's output. So a request's tokens do not depend on the batch it ran in, on preemption and
// recompute, or on anything else the engine did: the same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dsa {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, ties to the lower id); > 0: softmax(l / T)
  float top_p = 1.0f;        // in (0, 1]: draw only from the smallest set holding this much mass
  uint64_t seed = 0;         // the request's random stream

  bool greedy() const { return temperature == 0.0f; }
  // Throws kInvalidArgument naming the value: temperature < 0 or not finite, top_p outside (0, 1].
  void validate() const;
};

// The nucleus of a temperature-scaled distribution: token ids by falling probability (ties to the
// lower id), cut after the first prefix whose mass reaches top_p, with their probabilities
// normalized over the whole vocabulary (so they sum to that prefix's mass, not to 1).
// NaN logits never enter it. Requires temperature > 0.
struct Nucleus {
  std::vector<int32_t> tokens;
  std::vector<double> probs;
  double mass = 0;
};
Nucleus nucleus(std::span<const float> logits, const SamplingParams& params);

// The token for output position `index` of a request. Greedy when params.greedy().
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t index);

// A uniform double in [0, 1) from (seed, index) alone: a counter-based stream (splitmix64).
double sample_uniform(uint64_t seed, uint64_t index);

}  // namespace dsa
