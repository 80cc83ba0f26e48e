// Options and set-up shared by the dsa subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "dsa/backend.h"
#include "dsa/cache.h"
#include "dsa/model.h"
#include "dsa/text/tokenizer.h"

namespace dsa::tools {

struct ModelOptions {
  std::string preset = "tiny";
  std::string backend = "cpu";
  std::string index_k = "bf16";
  std::string latent = "bf16";
  bool ue8m0 = false;
  uint64_t seed = 0;
  int max_rows = 64;
  int max_context = 0;     // 0: the preset's max_position_embeddings (capped at 4096)
  int64_t pages = 0;       // 0: enough for max_rows full contexts
  std::string checkpoint;  // a checkpoint directory: its config and weights replace the preset's
};
void add_model_options(CLI::App* app, ModelOptions& o);

KvDtype parse_kv_dtype(const std::string& name, const char* flag);

// A model with synthetic weights and its cache, on one backend.
struct ModelStack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
};
ModelStack build_model_stack(const ModelOptions& o);

// Where a command's tokenizer comes from: a checkpoint directory's tokenizer.json, a tokenizer.json
// file, or the preset's built-in tokenizer (every preset uses "tiny": its 1024 ids fit each
// preset's vocabulary). A missing or unsupported tokenizer is bad input (kInvalidArgument).
struct TokenizerSource {
  std::string checkpoint, tokenizer_file, preset = "tiny";
};
text::Tokenizer load_tokenizer(const TokenizerSource& source);
// --checkpoint DIR | --tokenizer FILE | --preset P (tokenize, detokenize).
void add_tokenizer_options(CLI::App* cmd, TokenizerSource& s);
// The built-in tokenizer a preset's checkpoints carry.
std::string_view preset_tokenizer_name(std::string_view preset);

// "1,2,3" -> ids, each in [0, limit); `flag` and `limit_name` name them in errors.
std::vector<int32_t> parse_ids(const std::string& list, const char* flag, int32_t limit,
                               const char* limit_name);
// The contents of a file given on the command line.
std::string read_input_file(const std::string& path, const char* flag);

// Subcommands: each registers itself and sets the function that runs it (returning the exit
// status).
using Runner = std::function<int()>;
void register_generate(CLI::App& app, Runner& run);
void register_write_checkpoint(CLI::App& app, Runner& run);
void register_stress(CLI::App& app, Runner& run);
void register_check_replay(CLI::App& app, Runner& run);
void register_bench_decode(CLI::App& app, Runner& run);
void register_serve(CLI::App& app, Runner& run);
void register_bench_serve(CLI::App& app, Runner& run);
void register_bench_engine(CLI::App& app, Runner& run);
void register_tokenize(CLI::App& app, Runner& run);
void register_detokenize(CLI::App& app, Runner& run);

}  // namespace dsa::tools
