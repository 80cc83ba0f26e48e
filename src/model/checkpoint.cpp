// Checkpoint directories: config.json plus safetensors (one file, or shards with an index), read
// into Weights with dtype and shape checks, and written from Weights (optionally fp8 blocks).
#include "dsa/checkpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "dsa/error.h"
#include "dsa/file_io.h"
#include "model/json_read.h"
#include "model/safetensors.h"

namespace dsa {
namespace {

namespace fs = std::filesystem;
constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kScaleSuffix = "_scale_inv";

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }
static_assert(kFp8BlockSize == kGemmFp8Block, "the GEMM reads checkpoint blocks as they are");

// config.json and the index: regular files of at most 64 MiB, nesting at most 16 levels.
constexpr uint64_t kMaxJsonFileBytes = uint64_t(64) << 20;
constexpr int kMaxJsonDepth = 16;

nlohmann::json read_json(const fs::path& path) {
  const std::string text = read_regular_file(path.string(), kMaxJsonFileBytes, "checkpoint file");
  return parse_json_bounded(text, kMaxJsonDepth, fmt::format("checkpoint file {}", path.string()),
                            ErrorCode::kIo);
}

// Finds each tensor's file: the index's weight_map, or every tensor of model.safetensors.
class TensorSource {
 public:
  explicit TensorSource(const fs::path& dir) : dir_(dir) {
    const fs::path index = dir / kIndexFile;
    if (fs::exists(index)) {
      const nlohmann::json j = read_json(index);
      require(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
              ErrorCode::kIo, "checkpoint index {} has no weight_map object", index.string());
      for (const auto& [name, file] : j["weight_map"].items()) {
        require(file.is_string(), ErrorCode::kIo,
                "checkpoint index {}: weight_map entry of tensor {} is not a file name",
                index.string(), name);
        const std::string f = file.get<std::string>();
        require(f.find('/') == std::string::npos && f.find('\0') == std::string::npos &&
                    f != ".." && f != "." && !f.empty(),
                ErrorCode::kIo,
                "checkpoint index {}: tensor {} maps to '{}', which is not a file name in the "
                "checkpoint directory",
                index.string(), name, printable(f));
        require(fs::exists(dir / f), ErrorCode::kIo,
                "checkpoint index {} maps tensor {} to file {}, which does not exist",
                index.string(), name, (dir / f).string());
        weight_map_[name] = f;
      }
      return;
    }
    const fs::path single = dir / kSingleFile;
    require(fs::exists(single), ErrorCode::kIo, "checkpoint directory {} has neither {} nor {}",
            dir.string(), kSingleFile, kIndexFile);
    for (const auto& [name, t] : file(kSingleFile).tensors()) weight_map_[name] = kSingleFile;
  }

  struct Found {
    const SafetensorsFile* file;
    const StTensorInfo* info;
  };
  // Null file when no file holds `name`; throws when the index names a file without it.
  Found find(const std::string& name) {
    auto it = weight_map_.find(name);
    if (it == weight_map_.end()) return {nullptr, nullptr};
    const SafetensorsFile& f = file(it->second);
    const StTensorInfo* info = f.find(name);
    require(info != nullptr, ErrorCode::kIo,
            "checkpoint index maps tensor {} to file {}, but that file has no such tensor", name,
            f.path());
    return {&f, info};
  }
  const std::map<std::string, std::string>& weight_map() const { return weight_map_; }
  std::string listing() const {
    return fs::exists(dir_ / kIndexFile) ? (dir_ / kIndexFile).string()
                                         : (dir_ / kSingleFile).string();
  }

 private:
  const SafetensorsFile& file(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      it = files_.emplace(name, SafetensorsFile((dir_ / name).string())).first;
    }
    return it->second;
  }

  fs::path dir_;
  std::map<std::string, std::string> weight_map_;
  std::map<std::string, SafetensorsFile> files_;  // opened on first use
};

// One manifest tensor as the checkpoint stores it, checked against the spec: present, of the
// right shape and a loadable dtype, and for F8_E4M3 with its block scales.
struct StoredTensor {
  const SafetensorsFile* file = nullptr;
  const StTensorInfo* info = nullptr;
  const SafetensorsFile* scale_file = nullptr;  // F8_E4M3 only
  const StTensorInfo* scale = nullptr;
};

StoredTensor locate_tensor(TensorSource& src, const WeightSpec& spec,
                           std::set<std::string>& consumed) {
  const auto [file, t] = src.find(spec.name);
  require(file != nullptr, ErrorCode::kIo, "checkpoint is missing tensor {} (shape {}): not in {}",
          spec.name, shape_string(spec.shape), src.listing());
  require(t->shape == spec.shape, ErrorCode::kIo,
          "checkpoint tensor {} in {} has shape {}, the config needs {}", spec.name, file->path(),
          shape_string(t->shape), shape_string(spec.shape));
  consumed.insert(spec.name);
  if (t->dtype == StDtype::kBf16 || t->dtype == StDtype::kF32) return {file, t};
  require(t->dtype == StDtype::kF8E4M3, ErrorCode::kIo,
          "checkpoint tensor {} in {} has dtype {}; expected BF16, F32, or F8_E4M3 with {}{}",
          spec.name, file->path(), st_dtype_name(t->dtype), spec.name, kScaleSuffix);
  const std::string scale_name = spec.name + kScaleSuffix;
  require(t->shape.size() == 2, ErrorCode::kIo,
          "checkpoint tensor {} in {} is F8_E4M3 with shape {}; only 2-D matrices may be fp8",
          spec.name, file->path(), shape_string(t->shape));
  const auto [sfile, s] = src.find(scale_name);
  require(sfile != nullptr, ErrorCode::kIo,
          "checkpoint tensor {} in {} is F8_E4M3 but its scale tensor {} is missing", spec.name,
          file->path(), scale_name);
  const std::vector<int64_t> scale_shape = {blocks(t->shape[0]), blocks(t->shape[1])};
  require(s->dtype == StDtype::kF32 && s->shape == scale_shape, ErrorCode::kIo,
          "checkpoint scale tensor {} in {} is {} {}, expected F32 {}", scale_name, sfile->path(),
          st_dtype_name(s->dtype), shape_string(s->shape), shape_string(scale_shape));
  consumed.insert(scale_name);
  return {file, t, sfile, s};
}

// The bf16 values of one manifest tensor; records the names it consumed.
std::vector<Bf16> load_tensor(TensorSource& src, const WeightSpec& spec,
                              std::set<std::string>& consumed) {
  const StoredTensor st = locate_tensor(src, spec, consumed);
  const StTensorInfo* t = st.info;
  const std::span<const uint8_t> bytes = st.file->bytes(*t);
  std::vector<Bf16> out(size_t(t->numel()));
  if (t->dtype == StDtype::kBf16) {
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  if (t->dtype == StDtype::kF32) {
    for (size_t i = 0; i < out.size(); ++i) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      out[i] = float_to_bf16(v);
    }
    return out;
  }
  // F8_E4M3: dequantize by the 128x128 block scales, with the one definition the GEMM on fp8
  // weights uses too (dequant_fp8_weight), so a model holding these bytes computes the same bits.
  const int64_t rows = t->shape[0], cols = t->shape[1];
  const int64_t scale_cols = st.scale->shape[1];
  const std::span<const uint8_t> scale_bytes = st.scale_file->bytes(*st.scale);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float scale;
      std::memcpy(&scale,
                  scale_bytes.data() + 4 * ((r / kFp8BlockSize) * scale_cols + c / kFp8BlockSize),
                  4);
      out[size_t(r * cols + c)] = dequant_fp8_weight(Fp8E4M3{bytes[size_t(r * cols + c)]}, scale);
    }
  }
  return out;
}

// keep_fp8: adds the tensor as its stored fp8 bytes and block scales when it is F8_E4M3 (the
// values the bf16 load would give, by the same dequant_fp8_weight); false for any other dtype.
bool add_stored_fp8(Backend& backend, TensorSource& src, const WeightSpec& spec,
                    std::set<std::string>& consumed, Weights& weights) {
  const StoredTensor st = locate_tensor(src, spec, consumed);
  if (st.info->dtype != StDtype::kF8E4M3) return false;
  const std::span<const uint8_t> bytes = st.file->bytes(*st.info);
  const std::span<const uint8_t> scale_bytes = st.scale_file->bytes(*st.scale);
  std::vector<float> scales(scale_bytes.size() / 4);
  if (!scales.empty()) std::memcpy(scales.data(), scale_bytes.data(), scales.size() * 4);
  weights.add_fp8(backend, spec.name, spec.shape, {bytes.begin(), bytes.end()}, scales);
  return true;
}

// The names of weight_map that no manifest tensor consumed, for a warning or an error.
std::vector<std::string> unconsumed(const TensorSource& source,
                                    const std::set<std::string>& consumed) {
  std::vector<std::string> extra;
  for (const auto& [name, file] : source.weight_map()) {
    if (!consumed.count(name)) extra.push_back(name);
  }
  return extra;
}

}  // namespace

ModelConfig load_checkpoint_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / kConfigFile;
  require(fs::is_directory(dir), ErrorCode::kIo, "checkpoint directory {} does not exist", dir);
  require(fs::exists(path), ErrorCode::kIo, "checkpoint directory {} has no {}", dir, kConfigFile);
  // The weights come from the index when there is one; a model.safetensors beside it would be
  // silently ignored, so a directory holding both is refused.
  require(!(fs::exists(fs::path(dir) / kIndexFile) && fs::exists(fs::path(dir) / kSingleFile)),
          ErrorCode::kIo,
          "checkpoint directory {} holds both {} and {}; it is not clear which weights to load",
          dir, kIndexFile, kSingleFile);
  const nlohmann::json j = read_json(path);
  try {
    ModelConfig c = config_from_json(j);
    if (c.name.empty()) c.name = dir;
    return c;
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", path.string(), e.what()));
  }
}

Weights load_checkpoint(Backend& backend, const std::string& dir, ModelConfig* config_out,
                        const CheckpointLoadOptions& options) {
  const ModelConfig config = load_checkpoint_config(dir);
  TensorSource source{fs::path(dir)};
  Weights weights;
  std::set<std::string> consumed;
  for (const WeightSpec& spec : weight_manifest(config)) {
    if (options.keep_fp8 && weight_kept_fp8(spec.name, spec.shape) &&
        add_stored_fp8(backend, source, spec, consumed, weights)) {
      continue;
    }
    weights.add(backend, spec.name, spec.shape, load_tensor(source, spec, consumed));
  }
  const std::vector<std::string> extra = unconsumed(source, consumed);
  if (!extra.empty()) {
    const size_t shown = std::min<size_t>(extra.size(), 5);
    const std::string names =
        fmt::format("{}{}", fmt::join(extra.begin(), extra.begin() + shown, ", "),
                    extra.size() > shown ? ", ..." : "");
    require(!options.strict, ErrorCode::kIo,
            "checkpoint {} has {} tensor(s) the config does not use: {}", dir, extra.size(), names);
    spdlog::warn("checkpoint {}: ignoring {} tensor(s) the config does not use: {}", dir,
                 extra.size(), names);
  }
  if (config_out) *config_out = config;
  return weights;
}

CheckpointSummary inspect_checkpoint(const std::string& dir) {
  CheckpointSummary summary;
  summary.config = load_checkpoint_config(dir);
  TensorSource source{fs::path(dir)};
  std::set<std::string> consumed, files;
  for (const WeightSpec& spec : weight_manifest(summary.config)) {
    locate_tensor(source, spec, consumed);
    ++summary.manifest_tensors;
  }
  for (const auto& [name, file] : source.weight_map()) {
    const StTensorInfo* t = source.find(name).info;
    files.insert(file);
    const uint64_t bytes = t->end - t->begin;
    ++summary.tensors;
    summary.tensor_bytes += bytes;
    CheckpointSummary::DtypeCount& d = summary.dtypes[std::string(st_dtype_name(t->dtype))];
    ++d.tensors;
    d.bytes += bytes;
  }
  summary.files.assign(files.begin(), files.end());
  summary.unused = unconsumed(source, consumed);
  return summary;
}

bool checkpoint_stores_fp8(const std::string& name, const std::vector<int64_t>& shape) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // As DeepSeek's release: embeddings, lm_head, the router and the indexer's head weights
  // (DESIGN §1.3: W_iw is bf16) stay bf16.
  return shape.size() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight" &&
         !ends_with("mlp.gate.weight") && !ends_with("indexer.weights_proj.weight");
}

namespace {

struct OwnedTensor {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

Fp8Blocks quantize_fp8_blocks(const Bf16* w, int64_t rows, int64_t cols) {
  const int64_t br = blocks(rows), bc = blocks(cols);
  std::vector<float> scales(size_t(br * bc));
  std::vector<uint8_t> q(size_t(rows * cols));
  for (int64_t i = 0; i < br; ++i) {
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r0 = i * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
      const int64_t c0 = j * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          amax = std::max(amax, std::fabs(bf16_to_float(w[size_t(r * cols + c)])));
        }
      }
      const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
      scales[size_t(i * bc + j)] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          q[size_t(r * cols + c)] =
              float_to_fp8(bf16_to_float(w[size_t(r * cols + c)]) / scale).bits;
        }
      }
    }
  }
  return {std::move(q), std::move(scales)};
}

namespace {

// One manifest tensor as it is stored: bf16, f32 (the router bias) or fp8 plus its scales. A
// tensor the model holds as fp8 is written from its dequantized bf16 values.
std::vector<OwnedTensor> stored_tensors(Backend& backend, const WeightSpec& spec,
                                        const Weights& weights, bool fp8) {
  const std::vector<Bf16> host = weights.host_bf16(backend, spec.name);
  if (spec.name.ends_with("e_score_correction_bias")) {  // f32 in Hugging Face files
    std::vector<float> f(host.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_float(host[i]);
    return {{spec.name, StDtype::kF32, spec.shape, to_bytes(f)}};
  }
  if (!fp8 || !checkpoint_stores_fp8(spec.name, spec.shape)) {
    return {{spec.name, StDtype::kBf16, spec.shape, to_bytes(host)}};
  }
  auto [q, scales] = quantize_fp8_blocks(host.data(), spec.shape[0], spec.shape[1]);
  return {{spec.name, StDtype::kF8E4M3, spec.shape, std::move(q)},
          {spec.name + kScaleSuffix,
           StDtype::kF32,
           {blocks(spec.shape[0]), blocks(spec.shape[1])},
           to_bytes(scales)}};
}

// Splits units (a tensor with its scale) into `shards` contiguous runs of about equal bytes, none
// empty: returns each unit's shard.
std::vector<int> assign_shards(const std::vector<uint64_t>& unit_bytes, int shards) {
  uint64_t total = 0;
  for (uint64_t b : unit_bytes) total += b;
  std::vector<int> shard_of(unit_bytes.size());
  std::vector<int> count(size_t(shards), 0);
  uint64_t cum = 0;
  int s = 0;
  for (size_t i = 0; i < unit_bytes.size(); ++i) {
    const int units_left = int(unit_bytes.size() - i);
    const int shards_after = shards - 1 - s;
    const bool full = double(cum) >= double(total) * (s + 1) / shards;
    if (count[s] > 0 && (full || units_left <= shards_after)) ++s;
    shard_of[i] = s;
    ++count[s];
    cum += unit_bytes[i];
  }
  return shard_of;
}

// Writes every file of the checkpoint into `dir` (a fresh, empty directory).
void write_checkpoint_files(Backend& backend, const ModelConfig& config, const Weights& weights,
                            const std::vector<WeightSpec>& specs, const fs::path& dir,
                            const CheckpointWriteOptions& options) {
  write_output_file((dir / kConfigFile).string(), config_to_json(config).dump(2) + "\n",
                    "checkpoint config");
  std::vector<std::vector<OwnedTensor>> units;
  std::vector<uint64_t> unit_bytes;
  for (const WeightSpec& spec : specs) {
    auto it = weights.tensors().find(spec.name);
    require(it != weights.tensors().end() && it->second.shape == spec.shape,
            ErrorCode::kInvalidArgument, "write_checkpoint: weight {} {} is missing or misshapen",
            spec.name, shape_string(spec.shape));
    units.push_back(stored_tensors(backend, spec, weights, options.fp8));
    uint64_t bytes = 0;
    for (const OwnedTensor& t : units.back()) bytes += t.bytes.size();
    unit_bytes.push_back(bytes);
  }
  const std::vector<int> shard_of = assign_shards(unit_bytes, options.shards);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (int s = 0; s < options.shards; ++s) {
    const std::string file = options.shards == 1 ? std::string(kSingleFile)
                                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                               s + 1, options.shards);
    std::vector<StTensorView> views;
    for (size_t u = 0; u < units.size(); ++u) {
      if (shard_of[u] != s) continue;
      for (const OwnedTensor& t : units[u]) {
        views.push_back({t.name, t.dtype, t.shape, t.bytes});
        weight_map[t.name] = file;
        total += t.bytes.size();
      }
    }
    write_safetensors((dir / file).string(), views, metadata);
  }
  if (options.shards > 1) {
    write_output_file(
        (dir / kIndexFile).string(),
        nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) +
            "\n",
        "checkpoint index");
  }
  for (const auto& [name, text] : options.extra_files) {
    write_output_file((dir / name).string(), text, "checkpoint file");
  }
}

// A directory beside `target` (so a rename is atomic), named after it, created empty.
fs::path make_sibling_dir(const fs::path& target, std::string_view role) {
  std::string tmpl =
      (target.parent_path() / fmt::format(".{}.{}-XXXXXX", target.filename().string(), role))
          .string();
  require(::mkdtemp(tmpl.data()) != nullptr, ErrorCode::kWriteFailed,
          "cannot create a directory beside checkpoint directory {}: {}", target.string(),
          std::strerror(errno));
  return tmpl;
}

// Puts the finished directory `fresh` at `target`: an exchange when the filesystem allows it, so
// a reader sees the old checkpoint or the new one and never a mix; the old one is then removed.
void move_into_place(const fs::path& fresh, const fs::path& target) {
  std::error_code ec;
  if (!fs::exists(target)) {
    fs::rename(fresh, target, ec);
    require(!ec, ErrorCode::kWriteFailed, "cannot move the new checkpoint {} to {}: {}",
            fresh.string(), target.string(), ec.message());
    return;
  }
  if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
    // No exchange here (an old kernel or filesystem): move the old one aside, then rename.
    const fs::path old = make_sibling_dir(target, "old");
    fs::rename(target, old, ec);
    require(!ec, ErrorCode::kWriteFailed, "cannot move the old checkpoint {} aside: {}",
            target.string(), ec.message());
    fs::rename(fresh, target, ec);
    if (ec) {
      std::error_code undo;
      fs::rename(old, target, undo);
      fail(ErrorCode::kWriteFailed, "cannot move the new checkpoint {} to {}: {}", fresh.string(),
           target.string(), ec.message());
    }
    fs::remove_all(old, ec);
    return;
  }
  fs::remove_all(fresh, ec);  // now holds the old checkpoint
}

}  // namespace

void write_checkpoint(Backend& backend, const ModelConfig& config, const Weights& weights,
                      const std::string& dir, const CheckpointWriteOptions& options) {
  const std::vector<WeightSpec> specs = weight_manifest(config);
  require(options.shards >= 1 && options.shards <= int(specs.size()), ErrorCode::kInvalidArgument,
          "--shards = {} must be in [1, {}] (the tensor count)", options.shards, specs.size());
  require(!dir.empty() && dir.find('\0') == std::string::npos, ErrorCode::kInvalidArgument,
          "the checkpoint directory name '{}' is empty or holds a NUL byte", dir);
  for (const auto& [name, text] : options.extra_files) {
    require(!name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
                name != kConfigFile && name != kIndexFile && !name.ends_with(".safetensors"),
            ErrorCode::kInvalidArgument,
            "write_checkpoint: extra file '{}' is not a plain file name of its own", name);
  }
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(fs::absolute(dir), ec);
  require(!ec, ErrorCode::kInvalidArgument, "checkpoint directory {}: {}", dir, ec.message());
  if (fs::exists(target)) {
    require(fs::is_directory(target), ErrorCode::kInvalidArgument,
            "checkpoint directory {} exists and is not a directory", dir);
    require(fs::is_empty(target) || options.existing == ExistingCheckpoint::kReplace,
            ErrorCode::kInvalidArgument,
            "checkpoint directory {} is not empty; refusing to mix a new checkpoint with its "
            "files (give --force to replace the directory as a whole)",
            dir);
  }
  fs::create_directories(target.parent_path(), ec);
  require(!ec, ErrorCode::kWriteFailed, "cannot create the parent of checkpoint directory {}: {}",
          dir, ec.message());
  const fs::path fresh = make_sibling_dir(target, "tmp");
  try {
    write_checkpoint_files(backend, config, weights, specs, fresh, options);
    move_into_place(fresh, target);
  } catch (...) {
    fs::remove_all(fresh, ec);
    throw;
  }
}

}  // namespace dsa
