// Model configuration: presets, validation, and config.json (Hugging Face field names).
#include "dsa/config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "dsa/error.h"
#include "dsa/ops.h"
#include "dsa/slot.h"

namespace dsa {
namespace {

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

void require_positive(int value, const char* field) {
  require(value > 0, ErrorCode::kInvalidArgument, "config: {} = {} must be > 0", field, value);
}

void require_equal(int value, int expected, const char* field) {
  require(value == expected, ErrorCode::kInvalidArgument,
          "config: {} = {} is not supported (the cache layouts fix it at {})", field, value,
          expected);
}

}  // namespace

float ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope_scaling.type == "yarn") {
    const double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return float(scale);
}

void ModelConfig::validate() const {
  require_positive(hidden_size, "hidden_size");
  require_positive(num_hidden_layers, "num_hidden_layers");
  require_positive(num_attention_heads, "num_attention_heads");
  require_positive(q_lora_rank, "q_lora_rank");
  require_positive(index_n_heads, "index_n_heads");
  require_positive(index_topk, "index_topk");
  require_positive(vocab_size, "vocab_size");
  require_positive(intermediate_size, "intermediate_size");
  require_positive(max_position_embeddings, "max_position_embeddings");
  require_equal(kv_lora_rank, kKvLoraRank, "kv_lora_rank");
  require_equal(qk_rope_head_dim, kRopeDim, "qk_rope_head_dim");
  require_equal(index_head_dim, kIndexHeadDim, "index_head_dim");
  require_positive(qk_nope_head_dim, "qk_nope_head_dim");
  require_positive(v_head_dim, "v_head_dim");
  require(rms_norm_eps > 0 && rms_norm_eps < 1, ErrorCode::kInvalidArgument,
          "config: rms_norm_eps = {} must be in (0, 1)", rms_norm_eps);
  require(rope_theta > 0, ErrorCode::kInvalidArgument, "config: rope_theta = {} must be > 0",
          rope_theta);
  require(rope_scaling.type.empty() || rope_scaling.type == "yarn", ErrorCode::kInvalidArgument,
          "config: rope_scaling.type = '{}' is not supported (expected yarn or none)",
          rope_scaling.type);
  if (n_routed_experts > 0) {
    require_positive(num_experts_per_tok, "num_experts_per_tok");
    require_positive(moe_intermediate_size, "moe_intermediate_size");
    require(num_experts_per_tok <= n_routed_experts, ErrorCode::kInvalidArgument,
            "config: num_experts_per_tok = {} exceeds n_routed_experts = {}",
            num_experts_per_tok, n_routed_experts);
    require(n_routed_experts <= kMaxRoutedExperts, ErrorCode::kInvalidArgument,
            "config: n_routed_experts = {} exceeds the supported {}", n_routed_experts,
            kMaxRoutedExperts);
    require(n_shared_experts >= 0, ErrorCode::kInvalidArgument,
            "config: n_shared_experts = {} must be >= 0", n_shared_experts);
    require(routed_scaling_factor > 0, ErrorCode::kInvalidArgument,
            "config: routed_scaling_factor = {} must be > 0", routed_scaling_factor);
  }
  require(first_k_dense_replace >= 0 && first_k_dense_replace <= num_hidden_layers,
          ErrorCode::kInvalidArgument,
          "config: first_k_dense_replace = {} must be in [0, num_hidden_layers = {}]",
          first_k_dense_replace, num_hidden_layers);
}

ModelConfig config_from_json(const nlohmann::json& j) {
  ModelConfig c;
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    try {
      j[key].get_to(field);
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorCode::kInvalidArgument, "config: field {} has the wrong type: {}", key, e.what());
    }
  };
  get("_name_or_path", c.name);
  get("hidden_size", c.hidden_size);
  get("num_hidden_layers", c.num_hidden_layers);
  get("num_attention_heads", c.num_attention_heads);
  get("q_lora_rank", c.q_lora_rank);
  get("kv_lora_rank", c.kv_lora_rank);
  get("qk_nope_head_dim", c.qk_nope_head_dim);
  get("qk_rope_head_dim", c.qk_rope_head_dim);
  get("v_head_dim", c.v_head_dim);
  get("index_n_heads", c.index_n_heads);
  get("index_head_dim", c.index_head_dim);
  get("index_topk", c.index_topk);
  get("indexer_rope_interleave", c.indexer_rope_interleave);
  get("vocab_size", c.vocab_size);
  get("intermediate_size", c.intermediate_size);
  get("max_position_embeddings", c.max_position_embeddings);
  get("rms_norm_eps", c.rms_norm_eps);
  get("rope_theta", c.rope_theta);
  get("n_routed_experts", c.n_routed_experts);
  get("num_experts_per_tok", c.num_experts_per_tok);
  get("moe_intermediate_size", c.moe_intermediate_size);
  get("n_shared_experts", c.n_shared_experts);
  get("first_k_dense_replace", c.first_k_dense_replace);
  get("routed_scaling_factor", c.routed_scaling_factor);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& r = j["rope_scaling"];
    c.rope_scaling.type = r.value("type", r.value("rope_type", std::string()));
    c.rope_scaling.factor = r.value("factor", 1.0);
    c.rope_scaling.original_max_position_embeddings =
        r.value("original_max_position_embeddings", 4096);
    c.rope_scaling.beta_fast = r.value("beta_fast", 32.0);
    c.rope_scaling.beta_slow = r.value("beta_slow", 1.0);
    c.rope_scaling.mscale = r.value("mscale", 1.0);
    c.rope_scaling.mscale_all_dim = r.value("mscale_all_dim", 0.0);
  }
  c.validate();
  return c;
}

nlohmann::json config_to_json(const ModelConfig& c) {
  nlohmann::json j = {
      {"_name_or_path", c.name},
      {"architectures", {"DeepseekV32ForCausalLM"}},
      {"model_type", "deepseek_v32"},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"q_lora_rank", c.q_lora_rank},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"index_n_heads", c.index_n_heads},
      {"index_head_dim", c.index_head_dim},
      {"index_topk", c.index_topk},
      {"indexer_rope_interleave", c.indexer_rope_interleave},
      {"vocab_size", c.vocab_size},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"n_routed_experts", c.n_routed_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"n_shared_experts", c.n_shared_experts},
      {"first_k_dense_replace", c.first_k_dense_replace},
      {"routed_scaling_factor", c.routed_scaling_factor},
  };
  if (!c.rope_scaling.type.empty()) {
    j["rope_scaling"] = {{"type", c.rope_scaling.type},
                         {"factor", c.rope_scaling.factor},
                         {"original_max_position_embeddings",
                          c.rope_scaling.original_max_position_embeddings},
                         {"beta_fast", c.rope_scaling.beta_fast},
                         {"beta_slow", c.rope_scaling.beta_slow},
                         {"mscale", c.rope_scaling.mscale},
                         {"mscale_all_dim", c.rope_scaling.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j;
}

std::vector<std::string> preset_names() { return {"tiny", "tiny-moe", "v32"}; }

ModelConfig preset_config(std::string_view name) {
  ModelConfig c;
  c.name = std::string(name);
  if (name == "tiny" || name == "tiny-moe") {
    // Real per-token cache dims (512 + 64 latent, 128 index key); everything else shrunk so a
    // 2-core CI machine runs it, with index_topk small enough that selection really drops tokens
    // in contexts of a few hundred.
    c.hidden_size = 256;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.q_lora_rank = 128;
    c.index_n_heads = 4;
    c.index_topk = 32;
    c.vocab_size = 1024;  // the tiny tokenizer (data/tokenizers/tiny): byte-level BPE, 1024 ids
    c.intermediate_size = 512;
    c.max_position_embeddings = 1024;
  } else if (name == "v32") {
    // DeepSeek-V3.2's attention and indexer dims (128 heads, q_lora 1536, 64 index heads,
    // top-2048, yarn x40), with few dense layers and a smaller vocab, for GPU benchmarks.
    c.hidden_size = 7168;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 128;
    c.q_lora_rank = 1536;
    c.index_n_heads = 64;
    c.index_topk = 2048;
    c.vocab_size = 32768;
    c.intermediate_size = 18432;
    c.max_position_embeddings = 163840;
    c.rope_scaling = {"yarn", 40.0, 4096, 32.0, 1.0, 1.0, 1.0};
  } else {
    fail(ErrorCode::kInvalidArgument, "unknown preset '{}' (known: tiny, tiny-moe, v32)", name);
  }
  c.first_k_dense_replace = c.num_hidden_layers;
  if (name == "tiny-moe") {
    // Layer 0 dense, layer 1 MoE: 8 routed experts, top-2, and one shared expert.
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 128;
    c.n_shared_experts = 1;
    c.first_k_dense_replace = 1;
  }
  c.validate();
  return c;
}

}  // namespace dsa
