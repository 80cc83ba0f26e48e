// Weight manifest (names and shapes of a DeepSeek-V3.2 checkpoint), storage, synthetic init.
#include <xxhash.h>

#include <cmath>

#include "dsa/checkpoint.h"
#include "dsa/error.h"
#include "dsa/model.h"

namespace dsa {
namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// splitmix64: a counter-based generator, so each value depends only on (stream, index).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1).
float unit_uniform(uint64_t stream, uint64_t i) {
  return float(double(mix(stream ^ mix(i)) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

int64_t scale_blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

}  // namespace

std::string_view weight_dtype_name(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kFp8:
      return "fp8";
    case WeightDtype::kW8A8:
      return "w8a8";
    default:
      return "bf16";
  }
}

WeightDtype parse_weight_dtype(std::string_view name) {
  if (name == "bf16") return WeightDtype::kBf16;
  if (name == "fp8") return WeightDtype::kFp8;
  if (name == "w8a8") return WeightDtype::kW8A8;
  fail(ErrorCode::kInvalidArgument, "unknown weights dtype '{}' (expected bf16, fp8 or w8a8)",
       name);
}

bool weight_kept_fp8(const std::string& name, const std::vector<int64_t>& shape) {
  return checkpoint_stores_fp8(name, shape) && !name.ends_with("kv_b_proj.weight");
}

int64_t WeightTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<WeightSpec> weight_manifest(const ModelConfig& c) {
  using Init = WeightSpec::Init;
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, qlr = c.q_lora_rank;
  std::vector<WeightSpec> specs;
  auto add = [&](std::string name, std::vector<int64_t> shape, Init init = Init::kMatrix) {
    specs.push_back({std::move(name), std::move(shape), init});
  };
  add("model.embed_tokens.weight", {c.vocab_size, hidden});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const std::string a = p + "self_attn.";
    add(p + "input_layernorm.weight", {hidden}, Init::kNormWeight);
    add(a + "q_a_proj.weight", {qlr, hidden});
    add(a + "q_a_layernorm.weight", {qlr}, Init::kNormWeight);
    add(a + "q_b_proj.weight", {heads * c.qk_head_dim(), qlr});
    add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, hidden});
    add(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, Init::kNormWeight);
    add(a + "kv_b_proj.weight", {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
    add(a + "o_proj.weight", {hidden, heads * c.v_head_dim});
    add(a + "indexer.wq_b.weight", {int64_t(c.index_n_heads) * c.index_head_dim, qlr});
    add(a + "indexer.wk.weight", {c.index_head_dim, hidden});
    add(a + "indexer.k_norm.weight", {c.index_head_dim}, Init::kNormWeight);
    add(a + "indexer.k_norm.bias", {c.index_head_dim}, Init::kNormBias);
    add(a + "indexer.weights_proj.weight", {c.index_n_heads, hidden});
    add(p + "post_attention_layernorm.weight", {hidden}, Init::kNormWeight);
    if (!c.layer_is_moe(l)) {
      add(p + "mlp.gate_proj.weight", {c.intermediate_size, hidden});
      add(p + "mlp.up_proj.weight", {c.intermediate_size, hidden});
      add(p + "mlp.down_proj.weight", {hidden, c.intermediate_size});
    } else {
      // MoE: the router (its correction bias is f32 in Hugging Face files, bf16 here), the routed
      // experts, and the shared experts fused into one MLP of n_shared_experts times the width.
      const int64_t experts = c.n_routed_experts, inter = c.moe_intermediate_size;
      add(p + "mlp.gate.weight", {experts, hidden});
      add(p + "mlp.gate.e_score_correction_bias", {experts}, Init::kNormBias);
      for (int e = 0; e < experts; ++e) {
        const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
        add(x + "gate_proj.weight", {inter, hidden});
        add(x + "up_proj.weight", {inter, hidden});
        add(x + "down_proj.weight", {hidden, inter});
      }
      if (c.n_shared_experts > 0) {
        const int64_t shared = inter * c.n_shared_experts;
        add(p + "mlp.shared_experts.gate_proj.weight", {shared, hidden});
        add(p + "mlp.shared_experts.up_proj.weight", {shared, hidden});
        add(p + "mlp.shared_experts.down_proj.weight", {hidden, shared});
      }
    }
  }
  add("model.norm.weight", {hidden}, Init::kNormWeight);
  add("lm_head.weight", {c.vocab_size, hidden});
  return specs;
}

Weights Weights::synthetic(Backend& backend, const ModelConfig& config, uint64_t seed) {
  Weights w;
  for (const WeightSpec& spec : weight_manifest(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const uint64_t stream = XXH3_64bits_withSeed(spec.name.data(), spec.name.size(), seed);
    std::vector<Bf16> host(static_cast<size_t>(n));
    // Matrices: variance 1/fan_in (uniform with half-width sqrt(3/fan_in)); norm weights near 1.
    const double fan_in = double(spec.shape.back());
    const float amp =
        spec.init == WeightSpec::Init::kMatrix ? float(std::sqrt(3.0 / fan_in)) : 0.1f;
    const float base = spec.init == WeightSpec::Init::kNormWeight ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; ++i) host[i] = float_to_bf16(base + amp * unit_uniform(stream, i));
    w.add(backend, spec.name, spec.shape, host);
  }
  return w;
}

void Weights::add(Backend& backend, const std::string& name, std::vector<int64_t> shape,
                  const std::vector<Bf16>& host) {
  require(!tensors_.count(name), ErrorCode::kInvalidArgument, "weight {} is given twice", name);
  WeightTensor t;
  t.shape = std::move(shape);
  require(t.numel() == int64_t(host.size()), ErrorCode::kInvalidArgument,
          "weight {} has {} values, its shape {} needs {}", name, host.size(),
          shape_string(t.shape), t.numel());
  t.data = DeviceArray<Bf16>(backend, host.size());
  backend.copy_to_device(t.data.data(), host.data(), host.size() * sizeof(Bf16));
  tensors_.emplace(name, std::move(t));
}

void Weights::add_fp8(Backend& backend, const std::string& name, std::vector<int64_t> shape,
                      const std::vector<uint8_t>& bytes, const std::vector<float>& scales) {
  require(!tensors_.count(name), ErrorCode::kInvalidArgument, "weight {} is given twice", name);
  WeightTensor t;
  t.shape = std::move(shape);
  require(t.shape.size() == 2 && t.numel() == int64_t(bytes.size()) &&
              int64_t(scales.size()) == scale_blocks(t.shape[0]) * scale_blocks(t.shape[1]),
          ErrorCode::kInvalidArgument,
          "fp8 weight {} has {} bytes and {} scales; a 2-D shape {} needs {} and its 128x128 "
          "blocks",
          name, bytes.size(), scales.size(), shape_string(t.shape), t.numel());
  t.fp8 = DeviceArray<uint8_t>(backend, bytes.size());
  backend.copy_to_device(t.fp8.data(), bytes.data(), bytes.size());
  t.scale = DeviceArray<float>(backend, scales.size());
  backend.copy_to_device(t.scale.data(), scales.data(), scales.size() * sizeof(float));
  tensors_.emplace(name, std::move(t));
}

void Weights::quantize_fp8(Backend& backend) {
  for (auto& [name, t] : tensors_) {
    if (t.is_fp8() || !weight_kept_fp8(name, t.shape)) continue;
    std::vector<Bf16> host(size_t(t.numel()));
    backend.copy_to_host(host.data(), t.data.data(), host.size() * sizeof(Bf16));
    Fp8Blocks q = quantize_fp8_blocks(host.data(), t.shape[0], t.shape[1]);
    t.fp8 = DeviceArray<uint8_t>(backend, q.bytes.size());
    backend.copy_to_device(t.fp8.data(), q.bytes.data(), q.bytes.size());
    t.scale = DeviceArray<float>(backend, q.scales.size());
    backend.copy_to_device(t.scale.data(), q.scales.data(), q.scales.size() * sizeof(float));
    backend.synchronize();  // the host buffers are gone after this iteration
    t.data.reset();
  }
}

std::vector<Bf16> Weights::host_bf16(Backend& backend, const std::string& name) const {
  auto it = tensors_.find(name);
  require(it != tensors_.end(), ErrorCode::kInvalidArgument, "weight {} is missing", name);
  const WeightTensor& t = it->second;
  std::vector<Bf16> out(size_t(t.numel()));
  if (!t.is_fp8()) {
    backend.copy_to_host(out.data(), t.data.data(), out.size() * sizeof(Bf16));
    return out;
  }
  const int64_t rows = t.shape[0], cols = t.shape[1], ld_scale = scale_blocks(cols);
  std::vector<uint8_t> bytes(out.size());
  std::vector<float> scales(t.scale.size());
  backend.copy_to_host(bytes.data(), t.fp8.data(), bytes.size());
  backend.copy_to_host(scales.data(), t.scale.data(), scales.size() * sizeof(float));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = scales[size_t(r / kFp8BlockSize * ld_scale + c / kFp8BlockSize)];
      out[size_t(r * cols + c)] = dequant_fp8_weight(Fp8E4M3{bytes[size_t(r * cols + c)]}, scale);
    }
  }
  return out;
}

void Weights::fuse_rows(Backend& backend, const std::string& name,
                        const std::vector<std::string>& parts) {
  require(!parts.empty() && !tensors_.count(name), ErrorCode::kInvalidArgument,
          "fuse_rows: {} must name parts and be a new tensor", name);
  int64_t rows = 0, cols = -1;
  bool fp8 = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto it = tensors_.find(parts[i]);
    require(it != tensors_.end(), ErrorCode::kInvalidArgument, "weight {} is missing", parts[i]);
    const WeightTensor& t = it->second;
    require(t.shape.size() == 2, ErrorCode::kInvalidArgument,
            "fuse_rows {}: weight {} has shape {}, not a matrix", name, parts[i],
            shape_string(t.shape));
    if (i == 0) cols = t.shape[1];
    require(t.shape[1] == cols, ErrorCode::kInvalidArgument,
            "fuse_rows {}: weight {} has shape {}, a matrix of {} columns (as {}) is needed", name,
            parts[i], shape_string(t.shape), cols, parts[0]);
    fp8 = fp8 && t.is_fp8() && (i + 1 == parts.size() || t.shape[0] % kFp8BlockSize == 0);
    rows += t.shape[0];
  }
  WeightTensor fused;
  fused.shape = {rows, cols};
  if (fp8) {
    fused.fp8 = DeviceArray<uint8_t>(backend, size_t(rows * cols));
    fused.scale = DeviceArray<float>(backend, size_t(scale_blocks(rows) * scale_blocks(cols)));
  } else {
    fused.data = DeviceArray<Bf16>(backend, size_t(rows * cols));
  }
  int64_t row0 = 0;
  for (const std::string& part : parts) {
    WeightTensor& t = tensors_.at(part);
    const int64_t n = t.shape[0] * cols;
    std::vector<Bf16> host;
    if (fp8) {  // the codes, then the part's scale rows after the ones before it
      backend.copy_on_device(fused.fp8.data() + row0 * cols, t.fp8.data(), size_t(n));
      backend.copy_on_device(fused.scale.data() + row0 / kFp8BlockSize * scale_blocks(cols),
                             t.scale.data(), t.scale.size() * sizeof(float));
    } else if (!t.is_fp8()) {
      backend.copy_on_device(fused.data.data() + row0 * cols, t.data.data(), size_t(n) * 2);
    } else {  // an fp8 part of a bf16 fusion: its dequantized values
      host = host_bf16(backend, part);
      backend.copy_to_device(fused.data.data() + row0 * cols, host.data(), host.size() * 2);
    }
    backend.synchronize();  // the copies are done before the part's memory (or host) is freed
    row0 += t.shape[0];
    tensors_.erase(part);
  }
  tensors_.emplace(name, std::move(fused));
}

namespace {

const WeightTensor& find_tensor(const std::map<std::string, WeightTensor>& tensors,
                                const std::string& name, const std::vector<int64_t>& shape) {
  auto it = tensors.find(name);
  require(it != tensors.end(), ErrorCode::kInvalidArgument, "weight {} is missing", name);
  require(it->second.shape == shape, ErrorCode::kInvalidArgument,
          "weight {} has shape {}, the config needs {}", name, shape_string(it->second.shape),
          shape_string(shape));
  return it->second;
}

}  // namespace

const Bf16* Weights::get(const std::string& name, const std::vector<int64_t>& shape) const {
  const WeightTensor& t = find_tensor(tensors_, name, shape);
  require(!t.is_fp8(), ErrorCode::kInvalidArgument,
          "weight {} is held as fp8; only a projection's GEMM reads it (Weights::matrix)", name);
  return t.data.data();
}

WeightMatrix Weights::matrix(const std::string& name, const std::vector<int64_t>& shape) const {
  const WeightTensor& t = find_tensor(tensors_, name, shape);
  if (!t.is_fp8()) return {t.data.data(), nullptr, nullptr};
  return {nullptr, t.fp8.data(), t.scale.data(), fp8_activations_};
}

}  // namespace dsa
