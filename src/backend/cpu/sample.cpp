// Token sampling, the reference: one row at a time, in plain loops, with the arithmetic of
// dsa/sampling.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"
#include "dsa/sampling.h"

namespace dsa {

SampleDraw sample_row(const float* logits, int vocab, float temperature, float top_p, uint64_t seed,
                      uint64_t index, bool want_logprob, uint32_t* weights) {
  SampleDraw d;
  for (int i = 0; i < vocab; ++i) {  // NaN never wins; ties go to the lower id
    if (std::isnan(logits[i])) continue;
    if (d.best < 0 || logits[i] > logits[d.best]) d.best = i;
  }
  if (d.best < 0) {
    d.logprob = NAN;
    return d;
  }
  const float top = logits[d.best];
  const bool infinite = std::isinf(top);
  d.token = d.best;
  if (want_logprob && !infinite) {
    double sum = 0;  // ascending id
    for (int i = 0; i < vocab; ++i) {
      if (!std::isnan(logits[i])) sum += sample_exp(double(logits[i]) - double(top));
    }
    d.logprob = -std::log(sum);  // the best token's; replaced below when another is drawn
  }
  if (sample_is_greedy(temperature) || infinite) return d;

  std::vector<uint32_t> own;
  if (!weights) {
    own.resize(size_t(vocab));
    weights = own.data();
  }
  for (int i = 0; i < vocab; ++i) {
    weights[i] = sample_weight(logits[i], top, temperature);
    d.total += weights[i];
  }
  // The cut: the largest weight c with sum(w >= c) >= need. Distinct weights, heaviest first.
  const uint64_t need = sample_need(d.total, top_p);
  std::vector<uint32_t> keys(weights, weights + vocab);
  std::sort(keys.begin(), keys.end(), [](uint32_t a, uint32_t b) { return a > b; });
  for (size_t i = 0; i < keys.size() && d.mass < need; ++i) {
    d.cut = keys[i];
    d.mass += keys[i];
    while (i + 1 < keys.size() && keys[i + 1] == d.cut) d.mass += keys[++i];  // ties join
  }
  // The draw, in ascending id order over the nucleus.
  const uint64_t target = sample_target(sample_uniform(seed, index), d.mass);
  uint64_t running = 0;
  for (int i = 0; i < vocab; ++i) {
    if (weights[i] < d.cut) continue;
    running += weights[i];
    if (target < running) {
      d.token = i;
      break;
    }
  }
  if (want_logprob) d.logprob += double(logits[d.token]) - double(top);
  return d;
}

namespace cpu {

void sample(const SampleParams& p) {
  require(p.rows >= 0 && p.vocab >= 1 && p.vocab <= kMaxSampleVocab && p.ld_logits >= p.vocab,
          ErrorCode::kInvalidArgument,
          "sample: rows {} >= 0, vocab {} in [1, {}], ld_logits {} >= vocab", p.rows, p.vocab,
          kMaxSampleVocab, p.ld_logits);
  for (int r = 0; r < p.rows; ++r) {
    const SampleDraw d = sample_row(p.logits + int64_t(r) * p.ld_logits, p.vocab, p.temperature[r],
                                    p.top_p[r], p.seed[r], p.index[r], p.logprobs != nullptr);
    p.tokens[r] = d.token;
    if (p.logprobs) p.logprobs[r] = float(d.logprob);
  }
}

}  // namespace cpu
}  // namespace dsa
