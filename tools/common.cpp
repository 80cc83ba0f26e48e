#include "common.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

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

void add_tokenizer_options(CLI::App* cmd, TokenizerSource& s) {
  auto* ckpt =
      cmd->add_option("--checkpoint", s.checkpoint, "checkpoint directory (tokenizer.json)");
  auto* file =
      cmd->add_option("--tokenizer", s.tokenizer_file, "a tokenizer.json file")->excludes(ckpt);
  cmd->add_option("--preset", s.preset, "a preset's built-in tokenizer: tiny | tiny-moe | v32")
      ->capture_default_str()
      ->excludes(ckpt)
      ->excludes(file);
}

std::string_view preset_tokenizer_name(std::string_view preset) {
  (void)preset_config(preset);  // refuses an unknown preset
  return "tiny";
}

text::Tokenizer load_tokenizer(const TokenizerSource& source) {
  namespace fs = std::filesystem;
  try {
    if (!source.tokenizer_file.empty()) {
      require(fs::is_regular_file(source.tokenizer_file), ErrorCode::kInvalidArgument,
              "tokenizer file {} does not exist", source.tokenizer_file);
      const fs::path config =
          fs::path(source.tokenizer_file).parent_path() / "tokenizer_config.json";
      return text::Tokenizer::from_file(source.tokenizer_file,
                                        fs::exists(config) ? config : fs::path());
    }
    if (!source.checkpoint.empty()) {
      const fs::path file = fs::path(source.checkpoint) / "tokenizer.json";
      require(fs::is_regular_file(file), ErrorCode::kInvalidArgument,
              "checkpoint {} has no tokenizer.json (give --prompt-ids, or write the checkpoint "
              "with dsa write-checkpoint)",
              source.checkpoint);
      return text::Tokenizer::from_dir(source.checkpoint);
    }
    const auto files = text::builtin_tokenizer(preset_tokenizer_name(source.preset));
    require(files.has_value(), ErrorCode::kInternal, "no built-in tokenizer for preset '{}'",
            source.preset);
    return text::Tokenizer::from_json(files->tokenizer_json, files->tokenizer_config_json,
                                      "built-in tokenizer 'tiny'");
  } catch (const Error& e) {
    // A tokenizer that cannot be read or parsed is bad input to the command, not corruption.
    if (e.code() == ErrorCode::kIo) throw Error(ErrorCode::kInvalidArgument, e.what());
    throw;
  }
}

std::vector<int32_t> parse_ids(const std::string& list, const char* flag, int32_t limit,
                               const char* limit_name) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    int64_t id = -1;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    require(ec == std::errc() && ptr == item.data() + item.size() && !item.empty(),
            ErrorCode::kInvalidArgument, "{}: '{}' is not a token id", flag, item);
    require(id >= 0 && id < limit, ErrorCode::kInvalidArgument,
            "{}: token id {} is outside {} [0, {})", flag, id, limit_name, limit);
    ids.push_back(int32_t(id));
    pos = end + 1;
  }
  return ids;
}

std::string read_input_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), ErrorCode::kInvalidArgument, "{}: cannot read {}", flag, path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace dsa::tools
