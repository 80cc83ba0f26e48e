// The DSA model: weights, and one forward step over a batch of rows, built only from backend ops.
//
// A "row" is one token of one request: decode has one row per request, prefill one row per prompt
// token (causality comes from each row's seq_len = position + 1, through the same store, indexer
// and attention ops as decode).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsa/backend.h"
#include "dsa/cache.h"
#include "dsa/config.h"

namespace dsa {

// One named bf16 tensor in backend memory, with its shape.
struct WeightTensor {
  std::vector<int64_t> shape;
  DeviceArray<Bf16> data;
  int64_t numel() const;
};

// The expected tensors of a config, with Hugging Face DeepSeek-V3.2 names and shapes.
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  enum class Init { kMatrix, kNormWeight, kNormBias } init = Init::kMatrix;
};
std::vector<WeightSpec> weight_manifest(const ModelConfig& config);

class Weights {
 public:
  Weights() = default;
  // Deterministic synthetic weights: every tensor's values derive from (seed, name) alone.
  static Weights synthetic(Backend& backend, const ModelConfig& config, uint64_t seed);

  // Adds a tensor from host bf16 values; kInvalidArgument on a duplicate or a size mismatch.
  void add(Backend& backend, const std::string& name, std::vector<int64_t> shape,
           const std::vector<Bf16>& host);
  // The tensor's data; kInvalidArgument when missing or of another shape.
  const Bf16* get(const std::string& name, const std::vector<int64_t>& shape) const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, WeightTensor>& tensors() const { return tensors_; }

 private:
  std::map<std::string, WeightTensor> tensors_;
};

// The device-side inputs of one step: `rows` rows, fixed at launch (the bucket size when the step
// is captured). Per-row values are read from memory, so a graph replays them after a rewrite.
struct StepView {
  int rows = 0;
  const int32_t* tokens = nullptr;      // [rows]
  const int32_t* positions = nullptr;   // [rows]
  const int64_t* slots = nullptr;       // [rows] where the row's token is stored; kPadSlot = pad
  const int32_t* seq_lens = nullptr;    // [rows] tokens the row attends to; 0 for a padded row
  const int32_t* page_table = nullptr;  // [rows, ld_page_table]
  int64_t ld_page_table = 0;
  const int32_t* n_real = nullptr;      // [1] real rows; the stores ignore rows >= n_real
  int32_t* error_count = nullptr;       // [1] the step's error flag (stores, indexer page ids)
  float* logits = nullptr;              // [rows, vocab] output
  // Optional records of what each store was given, per layer l and pool k (0 latent, 1 index-K):
  //   write_digests [layers, 2, rows]: digest_rows of the store's inputs (the auditor's truth);
  //   store_values  [layers, rows, kStoreValuesDim]: the inputs themselves, c ‖ k_rope ‖ index
  //                 key (for an independent host-side check of the pools).
  uint64_t* write_digests = nullptr;
  float* store_values = nullptr;
};

// Per-step options that only fault injection changes.
struct StepOptions {
  StoreGuard index_k_guard = StoreGuard::kEnforced;
};

class MoeMlp;  // src/model/moe.h

class Model {
 public:
  // max_rows: the most rows one step may carry; max_context: the longest seq_len.
  Model(Backend& backend, ModelConfig config, Weights weights, int max_rows, int max_context);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  int max_rows() const { return max_rows_; }
  int max_context() const { return max_context_; }
  Backend& backend() const { return *backend_; }

  // Runs every layer over step.rows rows and writes step.logits. Stores go to `cache`.
  void forward(const StepView& step, KvCache& cache, const StepOptions& options = {});

 private:
  struct LayerPtrs;
  void attention(int layer, const StepView& step, KvCache& cache, const StepOptions& options);
  void indexer(int layer, const StepView& step, KvCache& cache, const StepOptions& options);
  void mlp(int layer, int rows);
  // The optional write_digests / store_values records of one store's inputs (see StepView).
  void record_store_inputs(int layer, PoolKind kind, const StepView& step, const PoolView& pool,
                           const float* values, int64_t ld);
  LayerPtrs layer_ptrs(int layer) const;

  Backend* backend_;
  ModelConfig config_;
  Weights weights_;
  int max_rows_, max_context_;
  std::vector<LayerPtrs> layers_;  // weight pointers per layer, resolved once
  DeviceArray<float> cos_sin_;  // [max_context, 32, 2]
  // Scratch, sized for max_rows (f32 unless noted).
  DeviceArray<float> h_, x_, qa_, q_, kv_, q_attn_, o_lat_, o_, gate_up_, act_;
  DeviceArray<float> qi_, ki_, wi_, index_logits_;
  DeviceArray<int64_t> topk_slots_;
  DeviceArray<int32_t> topk_positions_;
  std::unique_ptr<MoeMlp> moe_;  // the MoE layers' weights and scratch; null without MoE layers
};

// The host-side rope table: cos/sin of position * inv_freq for positions [0, max_position),
// with DeepSeek's yarn frequency correction when config.rope_scaling asks for it.
std::vector<float> rope_cos_sin_table(const ModelConfig& config, int max_position);

}  // namespace dsa
