// Model configuration, with the Hugging Face config.json field names of DeepSeek-V3.2.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dsa {

struct RopeScaling {
  std::string type;  // "" (none) or "yarn"
  double factor = 1.0;
  int original_max_position_embeddings = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

struct ModelConfig {
  std::string name;  // the preset or checkpoint it came from
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 128;
  int qk_rope_head_dim = 64;
  int v_head_dim = 128;
  int index_n_heads = 0;
  int index_head_dim = 128;
  int index_topk = 0;
  bool indexer_rope_interleave = false;  // DESIGN §1.3: the indexer's RoPE is half-split
  int vocab_size = 0;
  int intermediate_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // MoE. Layers [0, first_k_dense_replace) are dense SwiGLU; later layers are MoE when
  // n_routed_experts > 0.
  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int n_shared_experts = 0;
  int first_k_dense_replace = 0;
  double routed_scaling_factor = 1.0;  // multiplies the normalized routed-expert weights

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool layer_is_moe(int layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace;
  }
  // MLA's softmax scale: (qk_nope + qk_rope)^-1/2 * mscale^2, with yarn's mscale when asked.
  float softmax_scale() const;

  // Throws kInvalidArgument naming the field, its value and the limit it breaks.
  void validate() const;
};

ModelConfig config_from_json(const nlohmann::json& j);
nlohmann::json config_to_json(const ModelConfig& c);

// The shipped presets: "tiny" (CI-sized, real per-token dims), "tiny-moe" (tiny with an MoE second
// layer) and "v32" (DeepSeek-V3.2 attention and indexer dims, few layers, smaller vocab, for GPU
// benchmarks).
ModelConfig preset_config(std::string_view name);  // throws kInvalidArgument on unknown names
// c cut to its first `layers` layers (0: all of them), for runs that time a few layers of a large
// model; first_k_dense_replace is cut with it. kInvalidArgument when layers < 0.
ModelConfig keep_first_layers(ModelConfig c, int layers);
std::vector<std::string> preset_names();

}  // namespace dsa
