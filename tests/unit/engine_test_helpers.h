// Shared by the engine tests: the tiny preset on the CPU with caches of any size, random byte
// tokens, and running an engine until it is idle.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "common/test_util.h"
#include "dsa/engine.h"

namespace dsa::testing {

inline constexpr int kMaxRows = 16;
inline constexpr int kContext = 512;

// The tiny preset with synthetic weights on the CPU, and caches of any size for it.
struct Tiny {
  explicit Tiny(const ModelConfig& config = preset_config("tiny"))
      : backend(make_backend(BackendKind::kCpu)) {
    model = std::make_unique<Model>(*backend, config, Weights::synthetic(*backend, config, 5),
                                    kMaxRows, kContext);
  }
  std::unique_ptr<KvCache> cache(int64_t pages, KvDtype index_k = KvDtype::kBf16) const {
    CacheConfig c;
    c.num_layers = model->config().num_hidden_layers;
    c.num_pages = pages;
    c.index_k_dtype = index_k;
    return std::make_unique<KvCache>(*backend, c);
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// The tiny preset cut to one layer and one head (the cache's per-token dims stay real): for tests
// that run thousands of requests through the engine.
inline ModelConfig one_layer_config() {
  ModelConfig c = preset_config("tiny");
  c.hidden_size = 64;
  c.num_hidden_layers = 1;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 1;
  c.q_lora_rank = 32;
  c.index_n_heads = 1;
  c.qk_nope_head_dim = 32;
  c.v_head_dim = 32;
  c.intermediate_size = 64;
  c.validate();
  return c;
}

inline std::vector<int32_t> random_tokens(Rng& rng, int n) {
  std::vector<int32_t> t(size_t(n), 0);
  for (auto& x : t) x = int32_t(rng.integer(0, 255));
  return t;
}

// Outputs by request id.
inline std::map<int64_t, RequestOutput> finish_all(Engine& e) {
  e.run_until_idle();
  std::map<int64_t, RequestOutput> out;
  for (RequestOutput& o : e.take_finished()) out[o.id] = std::move(o);
  return out;
}

}  // namespace dsa::testing
