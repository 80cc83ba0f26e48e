// Model configuration: presets, validation, and config.json (Hugging Face field names).
#include "dsa/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "dsa/checkpoint.h"
#include "dsa/error.h"
#include "dsa/ops.h"
#include "dsa/slot.h"
#include "model/json_read.h"

namespace dsa {
namespace {

// Yarn's ranges: read from JSON and checked again by validate() (presets too).
constexpr double kMaxYarnFactor = 1e4, kMaxYarnBeta = 1e4, kMaxYarnMscale = 1e3;

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// Every integer field of config.json with its range. Fixed fields (lo == hi) are the dims the
// cache layouts and kernels are built for; the upper bounds keep every derived size well inside
// 64-bit arithmetic (the memory a configuration needs is checked separately, before allocating).
struct IntField {
  const char* name;
  int ModelConfig::*member;
  int64_t lo, hi;
};
constexpr IntField kIntFields[] = {
    {"hidden_size", &ModelConfig::hidden_size, 1, 1 << 16},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers, 1, 256},
    {"num_attention_heads", &ModelConfig::num_attention_heads, 1, 1024},
    {"q_lora_rank", &ModelConfig::q_lora_rank, 1, 1 << 14},
    {"kv_lora_rank", &ModelConfig::kv_lora_rank, kKvLoraRank, kKvLoraRank},
    {"qk_nope_head_dim", &ModelConfig::qk_nope_head_dim, 1, 1024},
    {"qk_rope_head_dim", &ModelConfig::qk_rope_head_dim, kRopeDim, kRopeDim},
    {"v_head_dim", &ModelConfig::v_head_dim, 1, 1024},
    {"index_n_heads", &ModelConfig::index_n_heads, 1, 1024},
    {"index_head_dim", &ModelConfig::index_head_dim, kIndexHeadDim, kIndexHeadDim},
    {"index_topk", &ModelConfig::index_topk, 1, 1 << 16},
    {"vocab_size", &ModelConfig::vocab_size, 1, 1 << 22},
    {"intermediate_size", &ModelConfig::intermediate_size, 1, 1 << 18},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings, 1, 1 << 22},
    {"n_routed_experts", &ModelConfig::n_routed_experts, 0, kMaxRoutedExperts},
    {"num_experts_per_tok", &ModelConfig::num_experts_per_tok, 0, kMaxRoutedExperts},
    {"moe_intermediate_size", &ModelConfig::moe_intermediate_size, 0, 1 << 18},
    {"n_shared_experts", &ModelConfig::n_shared_experts, 0, 64},
    {"first_k_dense_replace", &ModelConfig::first_k_dense_replace, 0, 256},
};

struct NumberField {
  const char* name;
  double ModelConfig::*member;
  double lo, hi;  // closed; the open ends are checked in validate()
};
constexpr NumberField kNumberFields[] = {
    {"rms_norm_eps", &ModelConfig::rms_norm_eps, 0.0, 1.0},
    {"rope_theta", &ModelConfig::rope_theta, 1.0, 1e9},
    {"routed_scaling_factor", &ModelConfig::routed_scaling_factor, 0.0, 1e3},
};

// Fields that do not change what the model computes: accepted with any value.
constexpr std::string_view kInertFields[] = {
    "_name_or_path",
    "architectures",
    "auto_map",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "use_cache",
    "ep_size",
    "num_nextn_predict_layers",
    "aux_loss_alpha",
    "seq_aux",
    "attention_dropout",
    "num_key_value_heads",
    "tokenizer_class",
    "output_router_logits",
    "router_aux_loss_coef",
};

// Fields with one meaning implemented here: any other value is refused.
struct FixedField {
  const char* name;
  nlohmann::json value;
  const char* meaning;
};
const std::vector<FixedField>& fixed_fields() {
  static const std::vector<FixedField> fields = {
      {"model_type", "deepseek_v32", "the DeepSeek-V3.2 architecture"},
      {"hidden_act", "silu", "SwiGLU MLPs"},
      {"attention_bias", false, "projections without bias"},
      {"tie_word_embeddings", false, "a separate lm_head"},
      {"rope_interleave", true, "interleaved RoPE pairs in MLA"},
      {"scoring_func", "sigmoid", "sigmoid router scores"},
      {"topk_method", "noaux_tc", "top-k by score plus e_score_correction_bias"},
      {"norm_topk_prob", true, "normalized routed weights"},
      {"moe_layer_freq", 1, "every layer from first_k_dense_replace on is MoE"},
      {"pretraining_tp", 1, "no tensor-parallel slicing"},
  };
  return fields;
}

bool contains(std::span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

constexpr std::string_view kYarnKeys[] = {"factor",    "original_max_position_embeddings",
                                          "beta_fast", "beta_slow",
                                          "mscale",    "mscale_all_dim"};

// One RoPE object: rope_scaling (transformers 4) or rope_parameters (transformers 5, which also
// carries rope_theta). Every key is known or refused; the type is yarn or none ("default").
struct RopeRead {
  RopeScaling scaling;
  std::optional<double> theta;
};
RopeRead read_rope_object(const nlohmann::json& r, const std::string& field) {
  require(r.is_object(), ErrorCode::kInvalidArgument,
          "{} = {} must be an object (or null), not a {}", field, json_excerpt(r), r.type_name());
  RopeRead out;
  std::optional<std::string> type;
  for (const auto& [key, v] : r.items()) {
    const std::string name = field + "." + key;
    if (v.is_null()) continue;
    if (key == "type" || key == "rope_type") {
      const std::string t = json_string(v, name);
      require(!type || *type == t, ErrorCode::kInvalidArgument,
              "{}.type = '{}' and {}.rope_type = '{}' disagree", field, *type, field, t);
      type = t;
    } else if (key == "rope_theta") {
      require(field == "rope_parameters", ErrorCode::kInvalidArgument,
              "{}: rope_theta belongs at the top level or in rope_parameters", name);
      out.theta = json_number(v, name, 1.0, 1e9);
    } else if (!contains(kYarnKeys, key)) {
      fail(ErrorCode::kInvalidArgument,
           "{} is not implemented (known keys: type/rope_type, rope_theta, {})", name,
           fmt::join(kYarnKeys, ", "));
    }
  }
  const std::string t = type.value_or("default");
  require(t == "yarn" || t == "default", ErrorCode::kInvalidArgument,
          "{}.type = '{}' is not implemented (expected yarn or default)", field, t);
  if (t == "default") {
    for (std::string_view key : kYarnKeys) {
      require(!r.contains(key) || r[std::string(key)].is_null(), ErrorCode::kInvalidArgument,
              "{}.{} has no meaning for RoPE type default (only for yarn)", field, key);
    }
    return out;
  }
  RopeScaling& s = out.scaling;
  s.type = "yarn";
  auto num = [&](const char* key, double& dst, double lo, double hi) {
    if (r.contains(key) && !r[key].is_null()) dst = json_number(r[key], field + "." + key, lo, hi);
  };
  num("factor", s.factor, 1, kMaxYarnFactor);
  num("beta_fast", s.beta_fast, 0, kMaxYarnBeta);
  num("beta_slow", s.beta_slow, 0, kMaxYarnBeta);
  num("mscale", s.mscale, 0, kMaxYarnMscale);
  num("mscale_all_dim", s.mscale_all_dim, 0, kMaxYarnMscale);
  if (r.contains("original_max_position_embeddings") &&
      !r["original_max_position_embeddings"].is_null()) {
    s.original_max_position_embeddings =
        int(json_int(r["original_max_position_embeddings"],
                     field + ".original_max_position_embeddings", 1, 1 << 22));
  }
  return out;
}

void read_rope(const nlohmann::json& j, ModelConfig& c) {
  std::optional<RopeRead> scaling, params;
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    scaling = read_rope_object(j["rope_scaling"], "rope_scaling");
  }
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    params = read_rope_object(j["rope_parameters"], "rope_parameters");
  }
  if (scaling && params) {
    const RopeScaling &a = scaling->scaling, &b = params->scaling;
    const bool same = a.type == b.type && a.factor == b.factor &&
                      a.original_max_position_embeddings == b.original_max_position_embeddings &&
                      a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow &&
                      a.mscale == b.mscale && a.mscale_all_dim == b.mscale_all_dim;
    require(same, ErrorCode::kInvalidArgument,
            "rope_scaling ({} x{}) and rope_parameters ({} x{}) disagree; give one of them",
            a.type.empty() ? "default" : a.type, a.factor, b.type.empty() ? "default" : b.type,
            b.factor);
  }
  if (params) {
    c.rope_scaling = params->scaling;
    if (params->theta) {
      require(!j.contains("rope_theta") || j["rope_theta"].is_null() ||
                  json_number(j["rope_theta"], "rope_theta", 1.0, 1e9) == *params->theta,
              ErrorCode::kInvalidArgument,
              "rope_theta = {} and rope_parameters.rope_theta = {} disagree",
              json_excerpt(j["rope_theta"]), *params->theta);
      c.rope_theta = *params->theta;
    }
  } else if (scaling) {
    c.rope_scaling = scaling->scaling;
  }
}

// n_group / topk_group: group-limited routing is not modelled, so only "no limit" is accepted.
void check_groups(const nlohmann::json& j) {
  const auto get = [&](const char* key) -> std::optional<int64_t> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    return json_int(j[key], key, 1, kMaxRoutedExperts);
  };
  const auto n_group = get("n_group"), topk_group = get("topk_group");
  require(n_group.value_or(1) == topk_group.value_or(n_group.value_or(1)),
          ErrorCode::kInvalidArgument,
          "n_group = {} with topk_group = {}: group-limited expert routing is not implemented "
          "(only topk_group == n_group)",
          n_group.value_or(1), topk_group.value_or(1));
}

void check_quantization(const nlohmann::json& q) {
  require(q.is_object(), ErrorCode::kInvalidArgument,
          "quantization_config = {} must be an object, not a {}", json_excerpt(q), q.type_name());
  for (const auto& [key, v] : q.items()) {
    const std::string name = "quantization_config." + key;
    if (key == "quant_method") {
      require(json_string(v, name) == "fp8", ErrorCode::kInvalidArgument,
              "{} = {} is not implemented (only fp8)", name, json_excerpt(v));
    } else if (key == "fmt") {
      require(json_string(v, name) == "e4m3", ErrorCode::kInvalidArgument,
              "{} = {} is not implemented (only e4m3)", name, json_excerpt(v));
    } else if (key == "weight_block_size") {
      require(v == nlohmann::json::array({kFp8BlockSize, kFp8BlockSize}),
              ErrorCode::kInvalidArgument, "{} = {} is not implemented (only [{}, {}])", name,
              json_excerpt(v), kFp8BlockSize, kFp8BlockSize);
    } else if (key != "activation_scheme" && key != "scale_fmt") {
      fail(ErrorCode::kInvalidArgument, "{} is not implemented", name);
    }
  }
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
  for (const IntField& f : kIntFields) {
    const int v = this->*f.member;
    if (f.lo == f.hi) {
      require(v == f.lo, ErrorCode::kInvalidArgument,
              "config: {} = {} is not supported (the cache layouts fix it at {})", f.name, v, f.lo);
    } else {
      require(v >= f.lo && v <= f.hi, ErrorCode::kInvalidArgument,
              "config: {} = {} must be in [{}, {}]", f.name, v, f.lo, f.hi);
    }
  }
  require(rms_norm_eps > 0 && rms_norm_eps < 1, ErrorCode::kInvalidArgument,
          "config: rms_norm_eps = {} must be in (0, 1)", rms_norm_eps);
  require(rope_theta > 1 && rope_theta <= 1e9, ErrorCode::kInvalidArgument,
          "config: rope_theta = {} must be in (1, 1e9]", rope_theta);
  require(rope_scaling.type.empty() || rope_scaling.type == "yarn", ErrorCode::kInvalidArgument,
          "config: rope_scaling.type = '{}' is not supported (expected yarn or none)",
          rope_scaling.type);
  if (rope_scaling.type == "yarn") {
    const RopeScaling& s = rope_scaling;
    require(s.factor >= 1 && s.factor <= kMaxYarnFactor, ErrorCode::kInvalidArgument,
            "config: rope_scaling.factor = {} must be in [1, {}]", s.factor, kMaxYarnFactor);
    require(s.original_max_position_embeddings >= 1 &&
                s.original_max_position_embeddings <= max_position_embeddings,
            ErrorCode::kInvalidArgument,
            "config: rope_scaling.original_max_position_embeddings = {} must be in [1, "
            "max_position_embeddings = {}]",
            s.original_max_position_embeddings, max_position_embeddings);
    require(s.beta_slow > 0 && s.beta_fast > s.beta_slow && s.beta_fast <= kMaxYarnBeta,
            ErrorCode::kInvalidArgument,
            "config: rope_scaling.beta_fast = {} and beta_slow = {} must satisfy 0 < beta_slow < "
            "beta_fast <= {}",
            s.beta_fast, s.beta_slow, kMaxYarnBeta);
    require(s.mscale >= 0 && s.mscale <= kMaxYarnMscale && s.mscale_all_dim >= 0 &&
                s.mscale_all_dim <= kMaxYarnMscale,
            ErrorCode::kInvalidArgument,
            "config: rope_scaling.mscale = {} and mscale_all_dim = {} must be in [0, {}]", s.mscale,
            s.mscale_all_dim, kMaxYarnMscale);
    // The cos/sin table would be scaled by yarn_mscale(mscale) / yarn_mscale(mscale_all_dim);
    // only a ratio of 1 is implemented.
    require(yarn_mscale(s.factor, s.mscale) == yarn_mscale(s.factor, s.mscale_all_dim),
            ErrorCode::kInvalidArgument,
            "config: rope_scaling.mscale = {} differs from mscale_all_dim = {}: scaling cos/sin "
            "by their ratio is not implemented (give them equal)",
            s.mscale, s.mscale_all_dim);
  }
  if (n_routed_experts > 0) {
    require(num_experts_per_tok >= 1 && num_experts_per_tok <= n_routed_experts,
            ErrorCode::kInvalidArgument,
            "config: num_experts_per_tok = {} must be in [1, n_routed_experts = {}]",
            num_experts_per_tok, n_routed_experts);
    require(moe_intermediate_size >= 1, ErrorCode::kInvalidArgument,
            "config: moe_intermediate_size = {} must be > 0 with n_routed_experts = {}",
            moe_intermediate_size, n_routed_experts);
    require(routed_scaling_factor > 0, ErrorCode::kInvalidArgument,
            "config: routed_scaling_factor = {} must be > 0", routed_scaling_factor);
  }
  require(first_k_dense_replace <= num_hidden_layers, ErrorCode::kInvalidArgument,
          "config: first_k_dense_replace = {} must be in [0, num_hidden_layers = {}]",
          first_k_dense_replace, num_hidden_layers);
}

ModelConfig config_from_json(const nlohmann::json& j) {
  require(j.is_object(), ErrorCode::kInvalidArgument, "config must be a JSON object, not a {}",
          j.type_name());
  ModelConfig c;
  for (const auto& [key, v] : j.items()) {
    if (v.is_null()) continue;  // as absent
    if (key == "_name_or_path") {
      c.name = json_string(v, key);
      continue;
    }
    if (key == "indexer_rope_interleave") {
      c.indexer_rope_interleave = json_bool(v, key);
      continue;
    }
    if (key == "rope_scaling" || key == "rope_parameters" || key == "n_group" ||
        key == "topk_group") {
      continue;  // below
    }
    if (key == "quantization_config") {
      check_quantization(v);
      continue;
    }
    const auto is = [&](const auto& f) { return key == f.name; };
    if (auto f = std::find_if(std::begin(kIntFields), std::end(kIntFields), is);
        f != std::end(kIntFields)) {
      // Read as 64-bit and range-checked before narrowing: 2^32 + 256 is refused, not 256.
      c.*(f->member) = int(json_int(v, key, f->lo, f->hi));
      continue;
    }
    if (auto f = std::find_if(std::begin(kNumberFields), std::end(kNumberFields), is);
        f != std::end(kNumberFields)) {
      c.*(f->member) = json_number(v, key, f->lo, f->hi);
      continue;
    }
    if (contains(kInertFields, key)) continue;
    const auto& fixed = fixed_fields();
    if (auto f = std::find_if(fixed.begin(), fixed.end(), is); f != fixed.end()) {
      require(v == f->value, ErrorCode::kInvalidArgument,
              "{} = {} is not implemented (only {}: {})", key, json_excerpt(v),
              json_excerpt(f->value), f->meaning);
      continue;
    }
    fail(ErrorCode::kInvalidArgument,
         "config field {} is not implemented: refusing to ignore it (its value: {})", key,
         json_excerpt(v));
  }
  read_rope(j, c);
  check_groups(j);
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
    j["rope_scaling"] = {
        {"type", c.rope_scaling.type},
        {"factor", c.rope_scaling.factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
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

ModelConfig keep_first_layers(ModelConfig c, int layers) {
  require(layers >= 0, ErrorCode::kInvalidArgument, "layers must be >= 0, got {}", layers);
  if (layers > 0) c.num_hidden_layers = std::min(layers, c.num_hidden_layers);
  c.first_k_dense_replace = std::min(c.first_k_dense_replace, c.num_hidden_layers);
  return c;
}

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
