// config.json is read field by field: integers as 64-bit and range-checked, every RoPE field (in
// rope_scaling or transformers 5's rope_parameters) validated, and any field whose meaning is not
// implemented refused by name rather than ignored.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/expect_error.h"
#include "dsa/config.h"
#include "dsa/error.h"

namespace dsa {
namespace {

void expect_refused(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  testing::expect_error(fn, ErrorCode::kInvalidArgument, parts);
}

nlohmann::json tiny_moe() { return config_to_json(preset_config("tiny-moe")); }
nlohmann::json v32() { return config_to_json(preset_config("v32")); }

constexpr const char* kIntFields[] = {"hidden_size",
                                      "num_hidden_layers",
                                      "num_attention_heads",
                                      "q_lora_rank",
                                      "kv_lora_rank",
                                      "qk_nope_head_dim",
                                      "qk_rope_head_dim",
                                      "v_head_dim",
                                      "index_n_heads",
                                      "index_head_dim",
                                      "index_topk",
                                      "vocab_size",
                                      "intermediate_size",
                                      "max_position_embeddings",
                                      "n_routed_experts",
                                      "num_experts_per_tok",
                                      "moe_intermediate_size",
                                      "n_shared_experts",
                                      "first_k_dense_replace"};

TEST(ConfigValidation, EveryIntegerFieldRefusesWrapsFractionsAndBooleans) {
  const std::vector<nlohmann::json> bad = {
      nlohmann::json(4294967552LL),   // 2^32 + 256: wrapped to 256 by a 32-bit read
      nlohmann::json(-4294967040LL),  // -2^32 + 256
      nlohmann::json(256.75),        nlohmann::json(true),
      nlohmann::json("256"),         nlohmann::json(18446744073709551615ULL)};
  for (const char* field : kIntFields) {
    for (const nlohmann::json& value : bad) {
      nlohmann::json j = tiny_moe();
      j[field] = value;
      expect_refused([&] { config_from_json(j); }, {field});
    }
  }
}

TEST(ConfigValidation, SizesHaveUpperBounds) {
  for (const auto& [field, value] :
       std::vector<std::pair<const char*, int64_t>>{{"num_hidden_layers", 2147483647},
                                                    {"index_topk", 10000000},
                                                    {"max_position_embeddings", 2147483647},
                                                    {"qk_nope_head_dim", 2147483647},
                                                    {"v_head_dim", 2147483647},
                                                    {"hidden_size", 1 << 20}}) {
    nlohmann::json j = tiny_moe();
    j[field] = value;
    expect_refused([&] { config_from_json(j); }, {field, std::to_string(value), "must be in [1, "});
  }
}

TEST(ConfigValidation, RopeScalingValueMustBeAnObject) {
  for (const nlohmann::json& value :
       {nlohmann::json("yarn"), nlohmann::json::array({1, 2}), nlohmann::json(40)}) {
    nlohmann::json j = v32();
    j["rope_scaling"] = value;
    expect_refused([&] { config_from_json(j); }, {"rope_scaling", "must be an object"});
  }
}

TEST(ConfigValidation, YarnFieldsAreRangeChecked) {
  const std::vector<std::tuple<const char*, nlohmann::json, const char*>> cases = {
      {"factor", 0, "rope_scaling.factor"},
      {"factor", -4, "rope_scaling.factor"},
      {"factor", 1e308, "rope_scaling.factor"},
      {"factor", "40", "rope_scaling.factor"},
      {"beta_fast", 1.0, "beta_fast"},   // == beta_slow
      {"beta_slow", 64.0, "beta_fast"},  // > beta_fast
      {"original_max_position_embeddings", 0, "original_max_position_embeddings"},
      {"original_max_position_embeddings", 4294967552LL, "original_max_position_embeddings"},
      {"mscale", -1.0, "rope_scaling.mscale"},
      {"mscale_all_dim", 0.5, "mscale_all_dim"},  // differs from mscale: cos/sin scaling
      {"type", "linear", "'linear' is not implemented"},
      {"attention_factor", 1.0, "rope_scaling.attention_factor is not implemented"},
  };
  for (const auto& [key, value, named] : cases) {
    nlohmann::json j = v32();
    j["rope_scaling"][key] = value;
    expect_refused([&] { config_from_json(j); }, {named});
  }
}

TEST(ConfigValidation, RopeParametersOfTransformers5AreRead) {
  // transformers 5: rope_parameters replaces rope_scaling and carries rope_theta.
  nlohmann::json j = v32();
  nlohmann::json params = j["rope_scaling"];
  params.erase("type");
  params["rope_type"] = "yarn";
  params["rope_theta"] = 50000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = params;
  const ModelConfig c = config_from_json(j);
  const ModelConfig want = preset_config("v32");
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, want.rope_scaling.factor);
  EXPECT_EQ(c.rope_theta, 50000.0);
  EXPECT_EQ(c.softmax_scale(), want.softmax_scale());  // yarn's mscale², not plain RoPE's
  nlohmann::json plain = j;
  plain["rope_parameters"] = {{"rope_type", "default"}};
  EXPECT_NE(config_from_json(plain).softmax_scale(), want.softmax_scale());

  nlohmann::json both = j;  // both spellings, disagreeing
  both["rope_scaling"] = v32()["rope_scaling"];
  both["rope_scaling"]["factor"] = 20.0;
  expect_refused([&] { config_from_json(both); }, {"rope_scaling", "rope_parameters", "disagree"});
  nlohmann::json unknown = j;
  unknown["rope_parameters"]["rope_type"] = "dynamic";
  expect_refused([&] { config_from_json(unknown); },
                 {"rope_parameters.type = 'dynamic' is not implemented"});
  nlohmann::json theta = j;
  theta["rope_theta"] = 10000.0;
  expect_refused([&] { config_from_json(theta); }, {"rope_theta", "disagree"});
}

TEST(ConfigValidation, FieldsWithoutAnImplementedMeaningAreRefused) {
  const std::vector<std::tuple<const char*, nlohmann::json, const char*>> cases = {
      {"sliding_window", 4096, "config field sliding_window is not implemented"},
      {"hidden_act", "gelu", "hidden_act"},
      {"attention_bias", true, "attention_bias"},
      {"tie_word_embeddings", true, "tie_word_embeddings"},
      {"scoring_func", "softmax", "scoring_func"},
      {"model_type", "llama", "model_type"},
      {"topk_group", 4, "group-limited"},
      {"quantization_config", nlohmann::json{{"quant_method", "int4"}}, "quant_method"},
      {"indexer_rope_interleave", 1, "indexer_rope_interleave"},
      {"rms_norm_eps", "1e-6", "rms_norm_eps"},
  };
  for (const auto& [key, value, named] : cases) {
    nlohmann::json j = tiny_moe();
    j["n_group"] = 8;
    j[key] = value;
    if (std::string(key) != "topk_group") j["topk_group"] = 8;
    expect_refused([&] { config_from_json(j); }, {named});
  }
}

TEST(ConfigValidation, AHuggingFaceStyleConfigLoads) {
  // The inert and fixed fields of DeepSeek's release, around tiny-moe's sizes.
  nlohmann::json j = tiny_moe();
  j.update(nlohmann::json::parse(R"({
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "hidden_act": "silu", "initializer_range": 0.02, "moe_layer_freq": 1,
    "n_group": 8, "topk_group": 8, "norm_topk_prob": true, "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1, "scoring_func": "sigmoid", "tie_word_embeddings": false,
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.44.2",
    "use_cache": true, "rope_theta": 10000,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128]}})"));
  const ModelConfig c = config_from_json(j);
  EXPECT_EQ(config_to_json(c), tiny_moe());
}

}  // namespace
}  // namespace dsa
