// The MoE MLP: router gemm, on-device routing, shared and routed SwiGLU experts.
#include "model/moe.h"

#include <algorithm>

#include "dsa/error.h"
#include "model/linear.h"

namespace dsa {

namespace {

// The expert whose tensors are named prefix + "{gate,up,gate_up,down}_proj.weight", `inter` wide.
ExpertWeights expert_weights(const Weights& weights, const std::string& prefix, int64_t inter,
                             int64_t hidden) {
  ExpertWeights w;
  if (weights.contains(prefix + "gate_up_proj.weight")) {
    w.gate_up = weights.matrix(prefix + "gate_up_proj.weight", {2 * inter, hidden});
  } else {
    w.gate = weights.matrix(prefix + "gate_proj.weight", {inter, hidden});
    w.up = weights.matrix(prefix + "up_proj.weight", {inter, hidden});
  }
  w.down = weights.matrix(prefix + "down_proj.weight", {hidden, inter});
  return w;
}

}  // namespace

MoeLayerWeights moe_layer_weights(const Weights& weights, const ModelConfig& c, int layer) {
  const int64_t hidden = c.hidden_size, experts = c.n_routed_experts;
  const int64_t inter = c.moe_intermediate_size, shared = inter * c.n_shared_experts;
  const std::string p = fmt::format("model.layers.{}.mlp.", layer);
  MoeLayerWeights w;
  w.router = weights.get(p + "gate.weight", {experts, hidden});
  w.bias = weights.get(p + "gate.e_score_correction_bias", {experts});
  for (int e = 0; e < experts; ++e) {
    w.experts.push_back(expert_weights(weights, fmt::format("{}experts.{}.", p, e), inter, hidden));
  }
  if (shared > 0) {
    w.shared = expert_weights(weights, p + "shared_experts.", shared, hidden);
    w.has_shared = true;
  }
  return w;
}

void fuse_expert_gate_up(Backend& backend, const ModelConfig& c, Weights& weights) {
  auto fuse = [&](const std::string& prefix) {
    weights.fuse_rows(backend, prefix + "gate_up_proj.weight",
                      {prefix + "gate_proj.weight", prefix + "up_proj.weight"});
  };
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.layer_is_moe(l)) continue;
    const std::string p = fmt::format("model.layers.{}.mlp.", l);
    for (int e = 0; e < c.n_routed_experts; ++e) fuse(fmt::format("{}experts.{}.", p, e));
    if (c.n_shared_experts > 0) fuse(p + "shared_experts.");
  }
}

MoeMlp::MoeMlp(Backend& backend, const ModelConfig& config, const Weights& weights, int max_rows)
    : backend_(&backend), config_(config), max_rows_(max_rows) {
  require(config.n_routed_experts >= 1 && config.n_routed_experts <= kMaxRoutedExperts,
          ErrorCode::kInvalidArgument, "MoE: n_routed_experts = {} must be in [1, {}]",
          config.n_routed_experts, kMaxRoutedExperts);
  require(config.num_experts_per_tok >= 1 && config.num_experts_per_tok <= config.n_routed_experts,
          ErrorCode::kInvalidArgument,
          "MoE: num_experts_per_tok = {} must be in [1, n_routed_experts = {}]",
          config.num_experts_per_tok, config.n_routed_experts);
  require(config.moe_intermediate_size >= 1 && max_rows >= 1, ErrorCode::kInvalidArgument,
          "MoE: moe_intermediate_size = {} and max_rows = {} must be >= 1",
          config.moe_intermediate_size, max_rows);
  layers_.resize(size_t(config.num_hidden_layers));
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (config.layer_is_moe(l)) layers_[l] = moe_layer_weights(weights, config, l);
  }
  const int64_t rows = max_rows, experts = config.n_routed_experts;
  const int64_t widest =
      int64_t(config.moe_intermediate_size) * std::max(1, config.n_shared_experts);
  router_logits_ = DeviceArray<float>(backend, size_t(rows * experts));
  route_weights_ = DeviceArray<float>(backend, size_t(rows * experts));
  gate_up_ = DeviceArray<float>(backend, size_t(rows * 2 * widest));
  act_ = DeviceArray<float>(backend, size_t(rows * widest));
}

void MoeMlp::expert(const ExpertWeights& w, int inter, const float* x, float* y, int rows,
                    const float* row_scale) {
  Backend& be = *backend_;
  const int hidden = config_.hidden_size;
  if (w.fused()) {
    linear(be, x, hidden, w.gate_up, 2 * inter, hidden, gate_up_.data(), 2 * inter, rows,
           GemmOutput::kOverwrite);
  } else {
    linear(be, x, hidden, w.gate, inter, hidden, gate_up_.data(), 2 * inter, rows,
           GemmOutput::kOverwrite);
    linear(be, x, hidden, w.up, inter, hidden, gate_up_.data() + inter, 2 * inter, rows,
           GemmOutput::kOverwrite);
  }
  be.swiglu({gate_up_.data(), act_.data(), rows, inter, 2 * inter, inter});
  if (row_scale)
    be.scale_rows({act_.data(), row_scale, rows, inter, inter, config_.n_routed_experts});
  linear(be, act_.data(), inter, w.down, hidden, inter, y, hidden, rows, GemmOutput::kAccumulate);
}

void MoeMlp::forward(int layer, const float* x, float* y, int rows) {
  require(layer >= 0 && layer < config_.num_hidden_layers && config_.layer_is_moe(layer),
          ErrorCode::kInvalidArgument, "MoE: layer {} is not an MoE layer", layer);
  require(rows >= 1 && rows <= max_rows_, ErrorCode::kInvalidArgument,
          "MoE: {} rows, sized for 1..{}", rows, max_rows_);
  Backend& be = *backend_;
  const MoeLayerWeights& w = layers_[layer];
  const int hidden = config_.hidden_size, experts = config_.n_routed_experts;
  const int inter = config_.moe_intermediate_size;

  linear(be, x, hidden, w.router, experts, hidden, router_logits_.data(), experts, rows,
         GemmOutput::kOverwrite);
  MoeRouteParams route;
  route.logits = router_logits_.data();
  route.bias = w.bias;
  route.weights = route_weights_.data();
  route.rows = rows;
  route.n_experts = experts;
  route.top_k = config_.num_experts_per_tok;
  route.ld_logits = route.ld_weights = experts;
  route.scaling = float(config_.routed_scaling_factor);
  be.moe_route(route);

  if (w.has_shared) {
    expert(w.shared, inter * config_.n_shared_experts, x, y, rows, nullptr);
  }
  for (int e = 0; e < experts; ++e) {
    expert(w.experts[size_t(e)], inter, x, y, rows, route_weights_.data() + e);
  }
}

}  // namespace dsa
