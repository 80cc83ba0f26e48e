// The MoE MLP of DeepSeek-V3 (DESIGN §1.8), built only from backend ops so that it runs on every
// backend and inside a captured graph: no host sync, no data-dependent shapes.
//
// Every routed expert runs densely over all rows, and each row's result is scaled by its combine
// weight, which is exactly 0 for an expert the row did not select. This costs n_routed_experts
// expert MLPs per row instead of top_k, but it is deterministic, batch-invariant (a row's result
// depends only on that row) and capturable; it suits the small presets it serves.
#pragma once

#include <vector>

#include "dsa/backend.h"
#include "dsa/config.h"
#include "dsa/model.h"

namespace dsa {

// One SwiGLU expert's matrices, bf16 or fp8: gate and up ([inter, hidden] each), or gate_up
// ([2 inter, hidden], gate's rows then up's: one GEMM, fuse_expert_gate_up), and down.
struct ExpertWeights {
  WeightMatrix gate, up, gate_up, down;
  bool fused() const { return gate_up.bf16 || gate_up.fp8; }
};

// The weights of one MoE layer, resolved from Weights by their Hugging Face names (gate_up_proj
// where fuse_expert_gate_up made it).
struct MoeLayerWeights {
  const Bf16* router = nullptr;        // [experts, hidden]  mlp.gate.weight
  const Bf16* bias = nullptr;          // [experts]          mlp.gate.e_score_correction_bias
  std::vector<ExpertWeights> experts;  // [moe_inter]-wide
  // The shared experts as one MLP of width moe_inter * n_shared_experts.
  ExpertWeights shared;
  bool has_shared = false;
};
// Throws kInvalidArgument when a tensor is missing or has the wrong shape.
MoeLayerWeights moe_layer_weights(const Weights& weights, const ModelConfig& config, int layer);

// Replaces every MoE expert's (and the shared experts') gate_proj and up_proj by one
// gate_up_proj, their rows stacked (Weights::fuse_rows): each output column reads its own weight
// row, so the fused GEMM gives the parts' columns, bit for bit on the CPU.
void fuse_expert_gate_up(Backend& backend, const ModelConfig& config, Weights& weights);

class MoeMlp {
 public:
  // Resolves the weights of every MoE layer of `config` and sizes the scratch for max_rows.
  MoeMlp(Backend& backend, const ModelConfig& config, const Weights& weights, int max_rows);

  // y[rows, hidden] += MoE_layer(x[rows, hidden]), where x is the post-attention-normed state:
  //   y += shared(x) + sum_e weight[r, e] * expert_e(x), experts in ascending id order,
  // each expert a SwiGLU MLP down(silu(gate x) * up x), the weight applied before `down`.
  void forward(int layer, const float* x, float* y, int rows);

  // The routing of the last forward: [max_rows, n_routed_experts] combine weights, in backend
  // memory (for tests).
  const float* route_weights() const { return route_weights_.data(); }

 private:
  // y += down(silu(gate x) * up x [* scale column]) over `rows` rows of width `inter`.
  void expert(const ExpertWeights& w, int inter, const float* x, float* y, int rows,
              const float* row_scale);

  Backend* backend_;
  ModelConfig config_;
  int max_rows_;
  std::vector<MoeLayerWeights> layers_;  // indexed by layer; empty entries for dense layers
  DeviceArray<float> router_logits_, route_weights_, gate_up_, act_;
};

}  // namespace dsa
