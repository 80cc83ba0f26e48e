// Options and set-up shared by the dsa subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "dsa/backend.h"
#include "dsa/cache.h"
#include "dsa/model.h"
#include "dsa/text/tokenizer.h"

namespace dsa::tools {

// ---- validated command-line numbers ----
// Every numeric option takes a plain decimal integer within its range and nothing else: "-1" for
// a count, "18446744073709551616", "", "1e3", "0x10" and " 5" are refused (exit 2) with a message
// naming the option, the value and the range, before CLI11 converts anything.
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator positive_number();   // a finite double > 0
CLI::Validator unsigned_integer();  // [0, 2^64 - 1], for seeds: a negative seed is refused
CLI::Validator non_empty(const char* what);

template <typename T>
CLI::Option* add_int_option(CLI::App* app, const std::string& name, T& value, int64_t lo,
                            int64_t hi, const std::string& help) {
  return app->add_option(name, value, help)->check(integer_in(lo, hi))->capture_default_str();
}
CLI::Option* add_seed_option(CLI::App* app, const std::string& name, uint64_t& value,
                             const std::string& help);

// Most rows one step may carry, and the longest context a command may ask for.
inline constexpr int kMaxRowsLimit = 4096;
inline constexpr int kMaxContextLimit = 1 << 20;
inline constexpr int64_t kMaxPagesLimit = int64_t(1) << 30;  // page ids are int32

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
  std::string gemm = "invariant";  // exact | invariant | fast (GemmMode; CUDA only)
  std::string weights = "bf16";    // bf16 | fp8 | w8a8 (WeightDtype: how the projections are held)
  std::string mla_splits;  // "" (the backend's bound) | 1 | 2 | 4 | 8 | 16 (CUDA sparse MLA)
  std::string mla_kernel;  // "" (the backend's family) | ws | hn | wgmma64 | wgmma | mma
};
// --preset, --checkpoint, --backend, --gemm, --weights, --mla-splits, --mla-kernel, --index-k,
// --latent, --ue8m0, --weights-seed.
void add_model_source_options(CLI::App* app, ModelOptions& o);
// --max-rows, --max-context, --pages.
void add_capacity_options(CLI::App* app, ModelOptions& o);
// Both.
void add_model_options(CLI::App* app, ModelOptions& o);

KvDtype parse_kv_dtype(const std::string& name, const char* flag);

// --mla-splits N: the CUDA sparse MLA kernels' bound on splits per row for the whole process, set
// as DSA_CUDA_SPARSE_MLA_MAX_SPLITS before the backend is made (the kernels read it at every
// call; the split count moves the bits, so it is fixed for the process, never per batch). A
// different value of that variable already in the environment is refused (kInvalidArgument)
// rather than silently overridden; with the CPU backend it only warns that nothing reads it. Call
// before make_backend. add_mla_splits_option registers the flag (add_model_source_options does).
CLI::Option* add_mla_splits_option(CLI::App* app, std::string& splits);
void apply_mla_splits(const std::string& splits, BackendKind backend);
// --mla-kernel NAME: the CUDA sparse MLA kernel family for the whole process (ws, the default; hn,
// the heads-as-N kernel for small batches; wgmma64, wgmma, mma), set as
// DSA_CUDA_SPARSE_MLA_VARIANT before the backend is made, with --mla-splits's rules: a different
// value already in the environment is refused, the CPU backend warns that nothing reads it.
CLI::Option* add_mla_kernel_option(CLI::App* app, std::string& kernel);
void apply_mla_kernel(const std::string& kernel, BackendKind backend);

// The config a command will run: the checkpoint's (only config.json is read) or the preset's.
ModelConfig resolve_config(const ModelOptions& o);
// The context a command runs with: --max-context, or the config's capped at 4096; refused past
// max_position_embeddings.
int resolve_context(const ModelOptions& o, const ModelConfig& config);

// Refuses (exit 2) a configuration whose estimate exceeds the backend's memory, naming the need,
// the options and fields that drive it, and the limit. Call before allocating anything.
void check_memory(const Backend& backend, const ModelConfig& config, int64_t max_rows,
                  int64_t max_context, const CacheConfig& cache,
                  WeightDtype weights = WeightDtype::kBf16);

// The weights of a model source: synthetic from the seed or the checkpoint's, then held as
// --weights says (fp8: Weights::quantize_fp8, the checkpoint writer's block quantizer).
Weights load_model_weights(Backend& backend, const ModelOptions& o, const ModelConfig& config);

// A model with synthetic weights and its cache, on one backend.
struct ModelStack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
};
ModelStack build_model_stack(const ModelOptions& o);

// A prompt file: a regular file of at most kPromptBytesPerToken bytes per token of the context.
inline constexpr int64_t kPromptBytesPerToken = 16;
std::string read_prompt_file(const std::string& path, int64_t context_tokens);

// Writes a result file (--json, --plot): exit 4 naming the file when any write fails.
void write_result_file(const std::string& path, const std::string& text, const char* flag);

// The exit-status table printed by `dsa --help`.
std::string exit_status_help();

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
// The contents of a file given on the command line: a regular file of at most 64 MiB.
inline constexpr uint64_t kMaxInputFileBytes = uint64_t(64) << 20;
std::string read_input_file(const std::string& path, const char* flag);

// Subcommands: each registers itself and sets the function that runs it (returning the exit
// status).
using SubcommandAction = std::function<int()>;  // not dsa::Runner: a parsed command to run
void register_generate(CLI::App& app, SubcommandAction& run);
void register_write_checkpoint(CLI::App& app, SubcommandAction& run);
void register_inspect(CLI::App& app, SubcommandAction& run);
void register_stress(CLI::App& app, SubcommandAction& run);
void register_check_replay(CLI::App& app, SubcommandAction& run);
void register_bench_decode(CLI::App& app, SubcommandAction& run);
void register_serve(CLI::App& app, SubcommandAction& run);
void register_bench_serve(CLI::App& app, SubcommandAction& run);
void register_bench_engine(CLI::App& app, SubcommandAction& run);
void register_tokenize(CLI::App& app, SubcommandAction& run);
void register_detokenize(CLI::App& app, SubcommandAction& run);

}  // namespace dsa::tools
