#include "common.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "dsa/checkpoint.h"
#include "dsa/config.h"
#include "dsa/error.h"
#include "dsa/file_io.h"

namespace dsa::tools {
namespace {

// Parses all of `s` as a decimal integer of type T (a leading '-' only for signed T).
template <typename T>
std::from_chars_result parse_decimal(const std::string& s, T& out) {
  const bool digits = !s.empty() && std::all_of(s.begin() + (s[0] == '-' ? 1 : 0), s.end(),
                                                [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || s == "-") return {s.data(), std::errc::invalid_argument};
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  if (r.ec == std::errc() && r.ptr != s.data() + s.size()) {
    return {r.ptr, std::errc::invalid_argument};
  }
  return r;
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        const auto r = parse_decimal(s, v);
        if (r.ec == std::errc::invalid_argument) {
          return fmt::format("'{}' is not an integer; expected one in [{}, {}]", s, lo, hi);
        }
        if (r.ec != std::errc() || v < lo || v > hi) {
          return fmt::format("{} is out of range: expected an integer in [{}, {}]", s, lo, hi);
        }
        return {};
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) {
          return fmt::format("'{}' is not a finite number", s);
        }
        if (!(v > 0)) return fmt::format("{} is out of range: expected a number > 0", s);
        return {};
      },
      "NUMBER > 0");
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto r = s.starts_with('-')
                           ? std::from_chars_result{s.data(), std::errc::invalid_argument}
                           : parse_decimal(s, v);
        if (r.ec == std::errc::invalid_argument) {
          return fmt::format(
              "'{}' is not an integer in [0, 2^64 - 1] (negative values are refused)", s);
        }
        if (r.ec != std::errc()) return fmt::format("{} is out of range [0, 2^64 - 1]", s);
        return {};
      },
      "UINT64");
}

CLI::Validator non_empty(const char* what) {
  return CLI::Validator(
      [what](std::string& s) -> std::string {
        if (s.empty()) return fmt::format("an empty value; expected {}", what);
        if (s.find('\0') != std::string::npos) return "the value contains a NUL byte";
        return {};
      },
      "");
}

CLI::Option* add_seed_option(CLI::App* app, const std::string& name, uint64_t& value,
                             const std::string& help) {
  return app->add_option(name, value, help)->check(unsigned_integer())->capture_default_str();
}

void add_model_source_options(CLI::App* app, ModelOptions& o) {
  app->add_option("--preset", o.preset, "model preset: tiny | tiny-moe | v32")
      ->capture_default_str();
  app->add_option("--checkpoint", o.checkpoint,
                  "load config and weights from this checkpoint directory instead of a preset")
      ->check(non_empty("a checkpoint directory"));
  app->add_option("--backend", o.backend, "cpu | cuda")->capture_default_str();
  app->add_option("--gemm", o.gemm,
                  "CUDA GEMM: invariant (tensor cores on bf16 x, batch-invariant) | exact (f32, "
                  "bit-identical to the CPU, slow) | fast (cuBLASLt, not batch-invariant)")
      ->check(CLI::IsMember({"exact", "invariant", "fast"}))
      ->capture_default_str();
  app->add_option("--weights", o.weights,
                  "how the dense projections are held: bf16 | fp8 (e4m3 with 128x128 block "
                  "scales, quantized from the bf16 values as write-checkpoint --fp8 does; half the "
                  "bytes; multiplied as their bf16 dequantization; --gemm invariant or exact) | "
                  "w8a8 (the same fp8 bytes multiplied as they are, each GEMM's input quantized "
                  "to e4m3 per 128 values: DeepSeek's fp8 inference numerics on the fp8 tensor "
                  "cores; --gemm invariant)")
      ->check(CLI::IsMember({"bf16", "fp8", "w8a8"}))
      ->capture_default_str();
  add_mla_splits_option(app, o.mla_splits);
  add_mla_kernel_option(app, o.mla_kernel);
  app->add_option("--index-k", o.index_k, "index-K cache dtype: bf16 | fp8")->capture_default_str();
  app->add_option("--latent", o.latent, "latent-KV cache dtype: bf16 | fp8")->capture_default_str();
  app->add_flag("--ue8m0", o.ue8m0, "round fp8 cache scales up to powers of two");
  add_seed_option(app, "--weights-seed", o.seed, "synthetic weight seed");
}

void add_capacity_options(CLI::App* app, ModelOptions& o) {
  add_int_option(app, "--max-rows", o.max_rows, 1, kMaxRowsLimit, "most rows one step may carry");
  add_int_option(app, "--max-context", o.max_context, 0, kMaxContextLimit,
                 "longest sequence (0: the config's, capped at 4096)");
  add_int_option(app, "--pages", o.pages, 0, kMaxPagesLimit,
                 "pages per pool, page 0 included (0: enough for max-rows full contexts, at most "
                 "64 rows)");
}

void add_model_options(CLI::App* app, ModelOptions& o) {
  add_model_source_options(app, o);
  add_capacity_options(app, o);
}

KvDtype parse_kv_dtype(const std::string& name, const char* flag) {
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "fp8") return KvDtype::kFp8;
  fail(ErrorCode::kInvalidArgument, "{} must be bf16 or fp8, got '{}'", flag, name);
}

namespace {
// A flag taking one of `values` (the list of a CUDA kernels' process-wide variable).
template <size_t kN>
CLI::Option* add_knob_option(CLI::App* app, const char* flag, std::string& value, const char* help,
                             const std::array<std::string_view, kN>& values) {
  return app->add_option(flag, value, help)
      ->check(CLI::IsMember(std::vector<std::string>(values.begin(), values.end())));
}

// A flag that sets one of the CUDA kernels' process-wide variables (they read it at every call;
// its value moves the bits, so it holds for the process's life): refused when the environment
// already holds a different value, a warning alone on the CPU backend, which reads none of them.
void set_process_knob(const char* flag, const std::string& value, std::string_view var,
                      const char* what, BackendKind backend) {
  if (value.empty()) return;
  const std::string name(var);
  const char* env = std::getenv(name.c_str());
  require(env == nullptr || value == env, ErrorCode::kInvalidArgument,
          "{} {} conflicts with {}={} in the environment: {} is one value per process; unset the "
          "variable or pass the same value",
          flag, value, name, env == nullptr ? "" : env, what);
  if (backend != BackendKind::kCuda) {
    spdlog::warn("{} {}: only the CUDA backend reads it; the CPU ignores it", flag, value);
    return;
  }
  require(setenv(name.c_str(), value.c_str(), 1) == 0, ErrorCode::kResourceExhausted,
          "{}: could not set {}", flag, name);
}
}  // namespace

CLI::Option* add_mla_splits_option(CLI::App* app, std::string& splits) {
  return add_knob_option(app, "--mla-splits", splits,
                         "CUDA sparse MLA: the bound on splits per row for this process (default: "
                         "4, or DSA_CUDA_SPARSE_MLA_MAX_SPLITS); 8 for single-stream latency, 2 or "
                         "1 for servers sized for large batches; each value gives other bits",
                         kSparseMlaSplitBounds);
}

void apply_mla_splits(const std::string& splits, BackendKind backend) {
  set_process_knob("--mla-splits", splits, kSparseMlaSplitsVar, "the split bound", backend);
}

CLI::Option* add_mla_kernel_option(CLI::App* app, std::string& kernel) {
  return add_knob_option(app, "--mla-kernel", kernel,
                         "CUDA sparse MLA: the kernel family for this process (default: ws, or "
                         "DSA_CUDA_SPARSE_MLA_VARIANT); hn (a CTA's 16 heads on the MMA's N) with "
                         "--mla-splits 8 for single-stream latency; each family gives other bits",
                         kSparseMlaKernels);
}

void apply_mla_kernel(const std::string& kernel, BackendKind backend) {
  set_process_knob("--mla-kernel", kernel, kSparseMlaKernelVar, "the kernel family", backend);
}

ModelConfig resolve_config(const ModelOptions& o) {
  return o.checkpoint.empty() ? preset_config(o.preset) : load_checkpoint_config(o.checkpoint);
}

int resolve_context(const ModelOptions& o, const ModelConfig& config) {
  require(o.max_context <= config.max_position_embeddings, ErrorCode::kOutOfRange,
          "--max-context {} exceeds max_position_embeddings = {} of {}", o.max_context,
          config.max_position_embeddings, config.name);
  return o.max_context > 0 ? o.max_context : std::min(config.max_position_embeddings, 4096);
}

void check_memory(const Backend& backend, const ModelConfig& config, int64_t max_rows,
                  int64_t max_context, const CacheConfig& cache, WeightDtype weights) {
  require_memory_fits(estimate_memory(config, max_rows, max_context, cache, weights), config, cache,
                      backend.memory_capacity_bytes(),
                      fmt::format("this run (--max-rows {}, context {}, --pages {})", max_rows,
                                  max_context, cache.num_pages),
                      backend.describe());
}

Weights load_model_weights(Backend& backend, const ModelOptions& o, const ModelConfig& config) {
  const WeightDtype dtype = parse_weight_dtype(o.weights);
  CheckpointLoadOptions load;
  load.keep_fp8 = holds_fp8(dtype);  // a checkpoint's fp8 tensors stay as stored
  Weights weights = o.checkpoint.empty() ? Weights::synthetic(backend, config, o.seed)
                                         : load_checkpoint(backend, o.checkpoint, nullptr, load);
  if (holds_fp8(dtype)) weights.quantize_fp8(backend);
  weights.set_fp8_activations(dtype == WeightDtype::kW8A8);
  return weights;
}

ModelStack build_model_stack(const ModelOptions& o) {
  ModelStack s;
  const KvDtype index_k = parse_kv_dtype(o.index_k, "--index-k");
  const KvDtype latent = parse_kv_dtype(o.latent, "--latent");
  const ModelConfig config = resolve_config(o);
  const int context = resolve_context(o, config);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  const int64_t pages_per_context = (context + kPageSize - 1) / kPageSize;
  cc.num_pages = o.pages > 0 ? o.pages : 1 + pages_per_context * std::min(o.max_rows, 64);
  cc.latent_dtype = latent;
  cc.index_k_dtype = index_k;
  cc.fp8_scale_rounding = o.ue8m0 ? ScaleRounding::kUe8m0 : ScaleRounding::kExact;
  apply_mla_splits(o.mla_splits, parse_backend(o.backend));
  apply_mla_kernel(o.mla_kernel, parse_backend(o.backend));
  s.backend = make_backend(parse_backend(o.backend));
  s.backend->set_gemm_mode(parse_gemm_mode(o.gemm));
  if (s.backend->kind() == BackendKind::kCuda && s.backend->gemm_mode() == GemmMode::kFast) {
    spdlog::warn(
        "--gemm fast (cuBLASLt) is not batch-invariant: a row's bits depend on its batch, so "
        "graph-vs-eager parity and reference divergence lose their bitwise meaning");
  }
  check_memory(*s.backend, config, o.max_rows, context, cc, parse_weight_dtype(o.weights));
  Weights weights = load_model_weights(*s.backend, o, config);
  s.model = std::make_unique<Model>(*s.backend, config, std::move(weights), o.max_rows, context);
  s.cache = std::make_unique<KvCache>(*s.backend, cc);
  return s;
}

std::string read_prompt_file(const std::string& path, int64_t context_tokens) {
  return read_regular_file(path, uint64_t(context_tokens * kPromptBytesPerToken),
                           fmt::format("--prompt-file (at most {} bytes per token of the "
                                       "{}-token context)",
                                       kPromptBytesPerToken, context_tokens));
}

void write_result_file(const std::string& path, const std::string& text, const char* flag) {
  write_output_file(path, text, fmt::format("{} file", flag));
}

std::string exit_status_help() {
  return fmt::format(
      "Exit status:\n"
      "  0  success; for check-replay and stress: no corruption found\n"
      "  {}  corruption found (check-replay, stress verdicts; generate: store errors)\n"
      "  {}  bad input: a flag, file, config or checkpoint was refused; the message names the "
      "value and its limit\n"
      "  {}  runtime failure: the device failed, or memory ran out mid-run\n"
      "  {}  an output could not be written (a --json or --plot file, a checkpoint, stdout)\n"
      "  {}  internal error: a bug in dsa\n",
      kExitCorruption, kExitBadInput, kExitRuntime, kExitWrite, kExitInternal);
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
  return read_regular_file(path, kMaxInputFileBytes, flag);
}

}  // namespace dsa::tools
