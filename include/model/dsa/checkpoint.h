// Checkpoint directories laid out as the DeepSeek-V3.2 releases on the Hugging Face hub:
//   config.json                       the model config (Hugging Face field names)
//   model.safetensors                 one file, or
//   model-0000k-of-0000n.safetensors  shards, with
//   model.safetensors.index.json      {"metadata": {"total_size": bytes}, "weight_map": {name:
//   file}}
//
// Tensor names and shapes are those of weight_manifest(config). A tensor loads from
//   BF16: as is;
//   F32: rounded to bf16 (nearest even), e.g. the router's e_score_correction_bias;
//   F8_E4M3 with "<name>_scale_inv" (F32, [ceil(out/128), ceil(in/128)]): each 128x128 block is
//     dequantized as bf16(fp8 * scale_inv), the product taken in f32 (nearest even) and then
//     rounded to bf16 (nearest even), as DeepSeek's own weight_dequant does.
// A missing, truncated or mismatched tensor is a dsa::Error (kIo) naming the tensor, the file,
// and what was expected and found.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dsa/backend.h"
#include "dsa/config.h"
#include "dsa/model.h"

namespace dsa {

inline constexpr int kFp8BlockSize = 128;  // the weight_scale_inv block: 128 x 128

struct CheckpointLoadOptions {
  // Tensors the manifest does not name are logged as a warning; strict makes them an error.
  bool strict = false;
  // F8_E4M3 tensors that weight_kept_fp8 names stay fp8 in memory (their bytes and scales as
  // stored; Weights::add_fp8) instead of loading as bf16: a model on them computes the bits of the
  // bf16 load (the same dequant_fp8_weight), reading half the bytes.
  bool keep_fp8 = false;
};

// Reads and validates DIR/config.json.
ModelConfig load_checkpoint_config(const std::string& dir);

// Loads every tensor of the manifest into `backend`, and the config into *config_out when set.
Weights load_checkpoint(Backend& backend, const std::string& dir, ModelConfig* config_out = nullptr,
                        const CheckpointLoadOptions& options = {});

// What write_checkpoint does with a directory that already holds files.
enum class ExistingCheckpoint : uint8_t {
  kRefuse,   // kInvalidArgument: a new checkpoint never mixes with another one's files
  kReplace,  // the directory as a whole is replaced: no file of the old one survives
};

// What a checkpoint holds, read from its config and safetensors headers without loading tensor
// data: the resolved config (what the model uses), the files, and the tensors by dtype.
struct CheckpointSummary {
  ModelConfig config;
  std::vector<std::string> files;  // the safetensors files the weights come from
  int64_t tensors = 0;             // in those files
  uint64_t tensor_bytes = 0;
  struct DtypeCount {
    int64_t tensors = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, DtypeCount> dtypes;  // "BF16", "F8_E4M3", ...
  int64_t manifest_tensors = 0;              // the config's tensors, every one found and checked
  std::vector<std::string> unused;           // tensors the config does not use
};
// Throws as load_checkpoint does when a manifest tensor is missing or mismatched.
CheckpointSummary inspect_checkpoint(const std::string& dir);

struct CheckpointWriteOptions {
  int shards = 1;    // 1: model.safetensors; more: model-0000k-of-0000n + the index
  bool fp8 = false;  // 2-D projections as F8_E4M3 with 128x128 block weight_scale_inv
  ExistingCheckpoint existing = ExistingCheckpoint::kRefuse;
  // Further files the checkpoint owns (e.g. a tokenizer), by plain file name: written into the
  // same fresh directory with the same checks, so they appear and are replaced with the weights.
  std::map<std::string, std::string> extra_files;
};

// Writes config.json and the safetensors file(s) of `weights` (read back from `backend`) as DIR:
// everything goes into a fresh directory beside it, which then replaces DIR in one rename, so a
// reader never sees a half-written checkpoint or a mix of an old one's files with the new. A
// failed write (ENOSPC) is kWriteFailed naming the file, and leaves DIR as it was. With fp8,
// embeddings, lm_head, the router and the indexer's weights_proj stay bf16, as in DeepSeek's
// release; 1-D tensors are bf16, the router bias f32.
void write_checkpoint(Backend& backend, const ModelConfig& config, const Weights& weights,
                      const std::string& dir, const CheckpointWriteOptions& options = {});

// Whether write_checkpoint(fp8) stores this manifest tensor as F8_E4M3.
bool checkpoint_stores_fp8(const std::string& name, const std::vector<int64_t>& shape);

// A [rows, cols] bf16 matrix quantized to e4m3 with one scale per 128x128 block, as
// write_checkpoint(fp8) stores it and Weights::quantize_fp8 holds it: scale = amax / 448 (1 for an
// all-zero block), q = e4m3(v / scale) (nearest even, saturating). scales is
// [ceil(rows / 128), ceil(cols / 128)], row-major.
struct Fp8Blocks {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};
Fp8Blocks quantize_fp8_blocks(const Bf16* w, int64_t rows, int64_t cols);

}  // namespace dsa
