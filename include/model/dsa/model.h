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
#include <string_view>
#include <vector>

#include "dsa/backend.h"
#include "dsa/cache.h"
#include "dsa/config.h"

namespace dsa {

// One named tensor in backend memory, with its shape: bf16 values (data), or, for a matrix that
// Weights::quantize_fp8 converted, fp8 e4m3 bytes with one f32 scale per 128 x 128 block (fp8 and
// scale; data is then empty). The value of an fp8 element is dequant_fp8_weight(byte, its block's
// scale) (dsa/dtype.h), the bf16 a checkpoint's fp8 tensor loads as.
struct WeightTensor {
  std::vector<int64_t> shape;
  DeviceArray<Bf16> data;
  DeviceArray<uint8_t> fp8;  // [rows, cols] e4m3 when is_fp8()
  DeviceArray<float> scale;  // [ceil(rows / 128), ceil(cols / 128)] when is_fp8()
  int64_t numel() const;
  bool is_fp8() const { return fp8.data() != nullptr; }
};

// A projection's weight operand (GemmParams): bf16, or fp8 with its block scales (row stride
// ceil(cols / 128)). Exactly one of bf16 and fp8 is set.
struct WeightMatrix {
  const Bf16* bf16 = nullptr;
  const uint8_t* fp8 = nullptr;
  const float* scale = nullptr;
  bool x_fp8 = false;  // with fp8: the GEMM quantizes x to e4m3 too (GemmParams::x_fp8)
};

// How the model holds its dense projections (--weights): bf16, or fp8 e4m3 with 128 x 128 block
// scales where weight_kept_fp8 says so (half the bytes a small-batch GEMM reads). kFp8 multiplies
// them as bf16(e4m3 * scale), the bf16 GEMM's numerics on the dequantized matrix; kW8A8 holds the
// same bytes and multiplies them as they are, with each GEMM's x quantized to e4m3 per 128-wide k
// block (GemmParams::x_fp8: DeepSeek's own fp8 inference numerics, no dequantization).
enum class WeightDtype : uint8_t { kBf16, kFp8, kW8A8 };
std::string_view weight_dtype_name(WeightDtype dtype);  // "bf16" | "fp8" | "w8a8"
WeightDtype parse_weight_dtype(std::string_view name);  // throws kInvalidArgument otherwise
inline bool holds_fp8(WeightDtype dtype) { return dtype != WeightDtype::kBf16; }
// Whether WeightDtype::kFp8 keeps this manifest tensor in fp8: the matrices a checkpoint stores as
// fp8 (checkpoint_stores_fp8: not the embeddings, lm_head, the router or the indexer's
// weights_proj) that the model multiplies as [n, k] with batch 1; kv_b_proj, which the absorbed
// attention reads per head and transposed, stays bf16.
bool weight_kept_fp8(const std::string& name, const std::vector<int64_t>& shape);

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
  // The tensor's bf16 data; kInvalidArgument when missing, of another shape, or held as fp8.
  const Bf16* get(const std::string& name, const std::vector<int64_t>& shape) const;
  // A 2-D tensor as a GEMM weight operand, bf16 or fp8; kInvalidArgument as get.
  WeightMatrix matrix(const std::string& name, const std::vector<int64_t>& shape) const;
  // Converts every tensor weight_kept_fp8 names to fp8 with write_checkpoint's block quantizer
  // (quantize_fp8_blocks: scale = amax / 448 per block), freeing its bf16 copy; one tensor at a
  // time, so the peak is the bf16 weights plus one tensor's fp8. Tensors already fp8 stay.
  void quantize_fp8(Backend& backend);
  // Whether matrix() hands fp8 tensors out with WeightMatrix::x_fp8 (WeightDtype::kW8A8).
  void set_fp8_activations(bool on) { fp8_activations_ = on; }
  bool fp8_activations() const { return fp8_activations_; }
  // Adds an fp8 tensor from host e4m3 bytes and block scales ([ceil(rows/128), ceil(cols/128)]).
  void add_fp8(Backend& backend, const std::string& name, std::vector<int64_t> shape,
               const std::vector<uint8_t>& bytes, const std::vector<float>& scales);
  // The bf16 values of a tensor on the host: as stored, or dequantized from fp8.
  std::vector<Bf16> host_bf16(Backend& backend, const std::string& name) const;
  // Replaces 2-D tensors of equal columns by one tensor `name` holding their rows in order (a
  // projection over the same input as one GEMM), freeing each part once it is copied (device to
  // device), so the peak is the parts plus the fused tensor. Every GEMM output element reads one
  // weight row, so the fused GEMM's columns are the parts' outputs: on fp8 weights too, because
  // the tensor stays fp8 only when every part is and every part but the last has a multiple of
  // 128 rows (each part's 128 x 128 scale blocks start on its own first row, as before).
  // Otherwise the fused tensor holds the parts' bf16 values (host_bf16: fp8 parts dequantized,
  // which is what their GEMM multiplies anyway). kInvalidArgument when a part is missing or not
  // 2-D with the first part's columns, or `name` exists.
  void fuse_rows(Backend& backend, const std::string& name, const std::vector<std::string>& parts);
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, WeightTensor>& tensors() const { return tensors_; }

 private:
  std::map<std::string, WeightTensor> tensors_;
  bool fp8_activations_ = false;
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
  const int32_t* n_real = nullptr;  // [1] real rows; the stores ignore rows >= n_real
  int32_t* error_count = nullptr;   // [1] the step's error flag (stores, indexer page ids)
  float* logits = nullptr;          // [rows, vocab] output
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
  // The indexer in two parts, each on the side lane: its key (and guarded store) and head
  // weights, which need x and x_proj's output only; then its query, logits and top-k, which need
  // q_up's output too. The selected slots land in topk_slots_.
  void indexer_key_and_weights(int layer, const StepView& step, KvCache& cache,
                               const StepOptions& options);
  void indexer_select(int layer, const StepView& step, KvCache& cache);
  void mlp(int layer, int rows);
  // The optional write_digests / store_values records of one store's inputs (see StepView).
  void record_store_inputs(int layer, PoolKind kind, const StepView& step, const PoolView& pool,
                           const float* values, int64_t ld);
  LayerPtrs layer_ptrs(int layer) const;
  // q_lora_rank + index head dim + latent dim (+ index heads when index_weights_in_x_proj_)
  int64_t xp_cols() const;
  Fp8Rows act_fp8(const WeightMatrix& w, int k);  // the fp8 rows for w's x, if w reads them
  int64_t qq_cols() const;  // heads * qk head dim + index heads * index head dim

  Backend* backend_;
  ModelConfig config_;
  Weights weights_;
  int max_rows_, max_context_;
  bool index_weights_in_x_proj_ = false;  // x_proj ends with indexer.weights_proj (bf16 weights)
  std::vector<LayerPtrs> layers_;         // weight pointers per layer, resolved once
  DeviceArray<float> cos_sin_;            // [max_context, 32, 2]
  // Scratch, sized for max_rows (f32 unless noted).
  // xp_: the projections of x, one GEMM (q_a ‖ index key ‖ latent [‖ index head weights], row
  // stride xp_cols());
  // qq_: those of norm(q_a), one GEMM (q ‖ index query, row stride qq_cols()).
  DeviceArray<float> h_, x_, xp_, qa_, qq_, q_attn_, o_lat_, o_, gate_up_, act_;
  DeviceArray<float> wi_, index_logits_;
  // An fp8 index-K cache's query encoding, written by indexer_query for indexer_logits: [rows,
  // index heads, 128] e4m3 and [rows, index heads] scales.
  DeviceArray<uint8_t> index_q_fp8_;
  DeviceArray<float> index_q_scale_;
  DeviceArray<Bf16> x_bf16_, qa_bf16_;  // bf16(x_), bf16(qa_): the fast GEMM's operands
  DeviceArray<uint8_t> act_fp8_;        // w8a8: the fp8 rows of the next projection's x (act_fp8)
  DeviceArray<float> act_fp8_scale_;
  int64_t act_fp8_ld_scales_ = 0;
  DeviceArray<int64_t> topk_slots_;
  DeviceArray<int32_t> topk_positions_;
  std::unique_ptr<MoeMlp> moe_;  // the MoE layers' weights and scratch; null without MoE layers
};

// The memory a configuration needs, estimated from its sizes alone (nothing is allocated), in
// saturating 64-bit arithmetic: a configuration too large to count needs "more than 2^64 bytes".
struct MemoryEstimate {
  uint64_t weights = 0;  // the manifest's tensors: bf16, or fp8 + scales where kept fp8
  uint64_t scratch = 0;  // per-step activations for max_rows rows, the rope table, top-k
  uint64_t cache = 0;    // the latent and index-K pools of every layer, and the page allocator
  uint64_t total() const;
};
MemoryEstimate estimate_memory(const ModelConfig& config, int64_t max_rows, int64_t max_context,
                               const CacheConfig& cache, WeightDtype weights = WeightDtype::kBf16);

// Refuses (kOutOfRange) an estimate above limit_bytes, before anything is allocated:
// "<what> needs 8.6 GB (weights 0.0 GB, KV cache 8.6 GB for 1048576 pages x 2 layers, scratch
// 0.0 GB); the <device> has 16.0 GB".
void require_memory_fits(const MemoryEstimate& estimate, const ModelConfig& config,
                         const CacheConfig& cache, uint64_t limit_bytes, std::string_view what,
                         std::string_view device);

// The host-side rope table: cos/sin of position * inv_freq for positions [0, max_position),
// with DeepSeek's yarn frequency correction when config.rope_scaling asks for it.
std::vector<float> rope_cos_sin_table(const ModelConfig& config, int max_position);

}  // namespace dsa
