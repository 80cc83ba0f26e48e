// MoE routing and per-row scaling: the executable spec of DeepSeek-V3's sigmoid top-k router.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"

namespace dsa::cpu {
namespace {

// The selection order: a larger choice score ranks first, a NaN ranks below every number. Equal
// scores do not beat each other, so scanning ids upward keeps the lower id on a tie.
bool ranks_above(float a, float b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return a > b;
}

}  // namespace

void moe_route(const MoeRouteParams& p) {
  require(p.rows >= 0, ErrorCode::kInvalidArgument, "moe_route: rows {} must be >= 0", p.rows);
  require(p.n_experts >= 1 && p.n_experts <= kMaxRoutedExperts, ErrorCode::kInvalidArgument,
          "moe_route: n_experts {} must be in [1, {}]", p.n_experts, kMaxRoutedExperts);
  require(p.top_k >= 1 && p.top_k <= p.n_experts, ErrorCode::kInvalidArgument,
          "moe_route: top_k {} must be in [1, n_experts = {}]", p.top_k, p.n_experts);
  require(p.ld_logits >= p.n_experts && p.ld_weights >= p.n_experts, ErrorCode::kInvalidArgument,
          "moe_route: row strides ld_logits {} and ld_weights {} must be >= n_experts {}",
          p.ld_logits, p.ld_weights, p.n_experts);
  require(!p.expert_ids || p.ld_expert_ids >= p.top_k, ErrorCode::kInvalidArgument,
          "moe_route: ld_expert_ids {} must be >= top_k {}", p.ld_expert_ids, p.top_k);
  require(p.rows == 0 || (p.logits && p.weights), ErrorCode::kInvalidArgument,
          "moe_route: logits and weights must be set");
  std::vector<float> score(size_t(p.n_experts)), choice(size_t(p.n_experts));
  std::vector<uint8_t> chosen(size_t(p.n_experts));
  for (int r = 0; r < p.rows; ++r) {
    const float* logits = p.logits + r * p.ld_logits;
    float* weights = p.weights + r * p.ld_weights;
    for (int e = 0; e < p.n_experts; ++e) {
      score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      choice[e] = p.bias ? score[e] + bf16_to_float(p.bias[e]) : score[e];
      chosen[e] = 0;
    }
    float sum = 0.0f;  // the selected scores, in selection order
    for (int k = 0; k < p.top_k; ++k) {
      int best = -1;
      for (int e = 0; e < p.n_experts; ++e) {
        if (!chosen[e] && (best < 0 || ranks_above(choice[e], choice[best]))) best = e;
      }
      chosen[best] = 1;
      sum += score[best];
      if (p.expert_ids) p.expert_ids[r * p.ld_expert_ids + k] = best;
    }
    // As DeepSeek-V3's norm_topk_prob: the 1e-20 keeps an all-zero selection finite.
    const float denominator = sum + 1e-20f;
    for (int e = 0; e < p.n_experts; ++e) {
      weights[e] = chosen[e] ? score[e] / denominator * p.scaling : 0.0f;
    }
  }
}

void scale_rows(const ScaleRowsParams& p) {
  require(p.rows >= 0 && p.dim >= 0 && p.ld_x >= p.dim, ErrorCode::kInvalidArgument,
          "scale_rows: rows {} and dim {} must be >= 0, row stride {} >= dim", p.rows, p.dim,
          p.ld_x);
  require(p.rows == 0 || p.dim == 0 || (p.x && p.scale), ErrorCode::kInvalidArgument,
          "scale_rows: x and scale must be set");
  for (int r = 0; r < p.rows; ++r) {
    const float s = p.scale[r * p.ld_scale];
    float* x = p.x + r * p.ld_x;
    for (int i = 0; i < p.dim; ++i) x[i] *= s;
  }
}

}  // namespace dsa::cpu
