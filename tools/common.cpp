#include "common.h"

#include <algorithm>

#include "dsa/checkpoint.h"
#include "dsa/config.h"
#include "dsa/error.h"

namespace dsa::tools {

void add_model_options(CLI::App* app, ModelOptions& o) {
  app->add_option("--preset", o.preset, "model preset: tiny | tiny-moe | v32")
      ->capture_default_str();
  app->add_option("--checkpoint", o.checkpoint,
                  "load config and weights from this checkpoint directory instead of a preset");
  app->add_option("--backend", o.backend, "cpu | cuda")->capture_default_str();
  app->add_option("--index-k", o.index_k, "index-K cache dtype: bf16 | fp8")->capture_default_str();
  app->add_option("--latent", o.latent, "latent-KV cache dtype: bf16 | fp8")->capture_default_str();
  app->add_flag("--ue8m0", o.ue8m0, "round fp8 cache scales up to powers of two");
  app->add_option("--weights-seed", o.seed, "synthetic weight seed")->capture_default_str();
  app->add_option("--max-rows", o.max_rows, "most rows one step may carry")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app->add_option("--max-context", o.max_context, "longest sequence (0: preset, capped at 4096)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--pages", o.pages,
                  "pages per pool, page 0 included (0: enough for max-rows "
                  "full contexts)")
      ->check(CLI::NonNegativeNumber);
}

KvDtype parse_kv_dtype(const std::string& name, const char* flag) {
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "fp8") return KvDtype::kFp8;
  fail(ErrorCode::kInvalidArgument, "{} must be bf16 or fp8, got '{}'", flag, name);
}

ModelStack build_model_stack(const ModelOptions& o) {
  ModelStack s;
  ModelConfig config;
  Weights weights;
  const KvDtype index_k = parse_kv_dtype(o.index_k, "--index-k");
  const KvDtype latent = parse_kv_dtype(o.latent, "--latent");
  s.backend = make_backend(parse_backend(o.backend));
  if (o.checkpoint.empty()) {
    config = preset_config(o.preset);
    if (o.vocab_size > config.vocab_size) config.vocab_size = o.vocab_size;
    weights = Weights::synthetic(*s.backend, config, o.seed);
  } else {
    weights = load_checkpoint(*s.backend, o.checkpoint, &config);
  }
  const int context =
      o.max_context > 0 ? o.max_context : std::min(config.max_position_embeddings, 4096);
  s.model = std::make_unique<Model>(*s.backend, config, std::move(weights), o.max_rows, context);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  const int64_t pages_per_context = (context + kPageSize - 1) / kPageSize;
  cc.num_pages = o.pages > 0 ? o.pages : 1 + pages_per_context * std::min(o.max_rows, 64);
  cc.latent_dtype = latent;
  cc.index_k_dtype = index_k;
  cc.fp8_scale_rounding = o.ue8m0 ? ScaleRounding::kUe8m0 : ScaleRounding::kExact;
  s.cache = std::make_unique<KvCache>(*s.backend, cc);
  return s;
}

}  // namespace dsa::tools
