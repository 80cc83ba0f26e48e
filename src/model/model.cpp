// One forward step of the DSA decoder (DESIGN §1), built only from backend ops.
#include "dsa/model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "dsa/error.h"
#include "model/linear.h"
#include "model/moe.h"

namespace dsa {

// Norm vectors and kv_b are bf16; the projections are bf16 or fp8 (Weights::quantize_fp8).
// The projections that read the same input are one GEMM over their rows fused in order
// (Weights::fuse_rows: each output column reads its own weight row, so the fused GEMM's columns
// are the parts' outputs, bit for bit on the CPU): x_proj = q_a ‖ indexer.wk ‖ kv_a over x,
// q_up = q_b ‖ indexer.wq_b over norm(q_a x), gate_up = gate ‖ up over the MLP's x (and each MoE
// expert's, fuse_expert_gate_up). With bf16
// weights x_proj also holds indexer.weights_proj last (its scale goes to indexer_logits' w_scale,
// the same f32 multiply the GEMM's alpha did); fp8 ones keep it apart, since it stays bf16 and a
// mixed fusion would be bf16 throughout.
struct Model::LayerPtrs {
  const Bf16 *input_norm, *q_a_norm, *kv_a_norm, *kv_b, *k_norm_w, *k_norm_b, *post_norm;
  WeightMatrix x_proj, q_up, o, weights_proj, gate_up, down;
};

namespace {

// y = rmsnorm(x), and y_bf16 = bf16(y) (row stride dim) for the projections that read y.
// y_fp8, when set, its fp8 rows for a GEMM with fp8 activations (GemmParams::x8).
void rmsnorm(Backend& be, const float* x, int64_t ld_x, float* y, int64_t ld_y, const Bf16* w,
             int rows, int dim, double eps, Bf16* y_bf16, const Fp8Rows& y_fp8 = {}) {
  RmsNormParams p{x, y, w, rows, dim, ld_x, ld_y, float(eps)};
  p.y_bf16 = y_bf16;
  p.ld_y_bf16 = dim;
  p.y_fp8 = y_fp8;
  be.rmsnorm(p);
}

constexpr GemmOutput kOverwrite = GemmOutput::kOverwrite;

}  // namespace

Model::Model(Backend& backend, ModelConfig config, Weights weights, int max_rows, int max_context)
    : backend_(&backend),
      config_(std::move(config)),
      weights_(std::move(weights)),
      max_rows_(max_rows),
      max_context_(max_context) {
  config_.validate();
  require(max_rows >= 1, ErrorCode::kInvalidArgument, "max_rows = {} must be >= 1", max_rows);
  require(max_context >= 1 && max_context <= config_.max_position_embeddings,
          ErrorCode::kInvalidArgument, "max_context = {} must be in [1, {}]", max_context,
          config_.max_position_embeddings);
  for (const WeightSpec& spec : weight_manifest(config_)) weights_.matrix(spec.name, spec.shape);
  auto x_parts = [](const std::string& a) {
    return std::vector<std::string>{a + "q_a_proj.weight", a + "indexer.wk.weight",
                                    a + "kv_a_proj_with_mqa.weight",
                                    a + "indexer.weights_proj.weight"};
  };
  index_weights_in_x_proj_ = true;  // every layer's parts bf16 (one row stride for all layers)
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    for (const std::string& part : x_parts(fmt::format("model.layers.{}.self_attn.", l))) {
      if (weights_.tensors().at(part).is_fp8()) index_weights_in_x_proj_ = false;
    }
  }
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l), a = p + "self_attn.";
    std::vector<std::string> parts = x_parts(a);
    if (!index_weights_in_x_proj_) parts.pop_back();  // weights_proj stays its own GEMM
    weights_.fuse_rows(backend, a + "x_proj.weight", parts);
    weights_.fuse_rows(backend, a + "q_up_proj.weight",
                       {a + "q_b_proj.weight", a + "indexer.wq_b.weight"});
    if (!config_.layer_is_moe(l)) {
      weights_.fuse_rows(backend, p + "mlp.gate_up_proj.weight",
                         {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
    }
    layers_.push_back(layer_ptrs(l));
  }
  if (config_.layer_is_moe(config_.num_hidden_layers - 1)) {
    fuse_expert_gate_up(backend, config_, weights_);
    moe_ = std::make_unique<MoeMlp>(backend, config_, weights_, max_rows);
  }

  // The widest gemm input, batch * m * k, over every projection of a step (MoE experts read the
  // hidden state or their intermediate, both below these).
  const int64_t H = config_.num_attention_heads;
  const int64_t widest =
      std::max<int64_t>({config_.hidden_size, config_.q_lora_rank, config_.intermediate_size,
                         H * config_.v_head_dim, H * config_.qk_nope_head_dim, H * kKvLoraRank});
  backend.reserve_gemm_scratch(size_t(max_rows) * size_t(widest), max_rows);
  const std::vector<float> table = rope_cos_sin_table(config_, max_context);
  cos_sin_ = DeviceArray<float>(backend, table.size());
  backend.copy_to_device(cos_sin_.data(), table.data(), table.size() * sizeof(float));

  const int64_t R = max_rows;
  auto f32 = [&](int64_t n) { return DeviceArray<float>(backend, size_t(R * n)); };
  h_ = f32(config_.hidden_size);
  x_ = f32(config_.hidden_size);
  xp_ = f32(xp_cols());
  qa_ = f32(config_.q_lora_rank);
  x_bf16_ = DeviceArray<Bf16>(backend, size_t(R) * config_.hidden_size);
  qa_bf16_ = DeviceArray<Bf16>(backend, size_t(R) * config_.q_lora_rank);
  qq_ = f32(qq_cols());
  q_attn_ = f32(H * kLatentDim);
  o_lat_ = f32(H * kKvLoraRank);
  o_ = f32(H * config_.v_head_dim);
  gate_up_ = f32(2 * int64_t(config_.intermediate_size));
  act_ = f32(config_.intermediate_size);
  if (!index_weights_in_x_proj_) wi_ = f32(config_.index_n_heads);
  index_logits_ = f32(max_context);
  index_q_fp8_ = DeviceArray<uint8_t>(backend, size_t(R) * config_.index_n_heads * kIndexHeadDim);
  index_q_scale_ = f32(config_.index_n_heads);
  topk_slots_ = DeviceArray<int64_t>(backend, size_t(R * config_.index_topk));
  topk_positions_ = DeviceArray<int32_t>(backend, size_t(R * config_.index_topk));
  if (weights_.fp8_activations()) {
    // The fp8 rows the norms and SwiGLU write for the w8a8 projections that read them next
    // (x_proj, q_up, gate_up, down): one buffer, each use consumed before the next is written.
    // Zeroed once: a GEMM reads the scales of its tile's rows past the batch (never using them).
    const int64_t widest_k =
        std::max<int64_t>({config_.hidden_size, config_.q_lora_rank, config_.intermediate_size});
    act_fp8_ld_scales_ = (R + 7) / 8 * 8;
    act_fp8_ = DeviceArray<uint8_t>(backend, size_t(R * widest_k));
    act_fp8_scale_ = DeviceArray<float>(
        backend, size_t((widest_k + kFp8BlockCols - 1) / kFp8BlockCols * act_fp8_ld_scales_));
    backend.fill(act_fp8_.data(), 0, act_fp8_.size());
    backend.fill(act_fp8_scale_.data(), 0, act_fp8_scale_.bytes());
  }
}

// The fp8 rows of a k-wide activation for w, when w takes fp8 activations; else none.
Fp8Rows Model::act_fp8(const WeightMatrix& w, int k) {
  if (!w.fp8 || !w.x_fp8 || act_fp8_.size() == 0) return {};
  return {act_fp8_.data(), act_fp8_scale_.data(), k, act_fp8_ld_scales_};
}

Model::~Model() = default;

int64_t Model::xp_cols() const {
  return config_.q_lora_rank + kIndexHeadDim + kLatentDim +
         (index_weights_in_x_proj_ ? config_.index_n_heads : 0);
}
int64_t Model::qq_cols() const {
  return int64_t(config_.num_attention_heads) * config_.qk_head_dim() +
         int64_t(config_.index_n_heads) * kIndexHeadDim;
}

Model::LayerPtrs Model::layer_ptrs(int l) const {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, H = c.num_attention_heads, qlr = c.q_lora_rank;
  const int64_t IH = c.index_n_heads, inter = c.intermediate_size;
  const std::string p = fmt::format("model.layers.{}.", l), a = p + "self_attn.";
  auto w = [&](const std::string& name, std::vector<int64_t> shape) {
    return weights_.get(name, shape);
  };
  auto m = [&](const std::string& name, std::vector<int64_t> shape) {
    return weights_.matrix(name, shape);
  };
  LayerPtrs L{};
  L.input_norm = w(p + "input_layernorm.weight", {hidden});
  L.x_proj = m(a + "x_proj.weight", {xp_cols(), hidden});
  L.q_a_norm = w(a + "q_a_layernorm.weight", {qlr});
  L.q_up = m(a + "q_up_proj.weight", {qq_cols(), qlr});
  L.kv_a_norm = w(a + "kv_a_layernorm.weight", {kKvLoraRank});
  L.kv_b = w(a + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), kKvLoraRank});
  L.o = m(a + "o_proj.weight", {hidden, H * c.v_head_dim});
  L.k_norm_w = w(a + "indexer.k_norm.weight", {kIndexHeadDim});
  L.k_norm_b = w(a + "indexer.k_norm.bias", {kIndexHeadDim});
  if (!index_weights_in_x_proj_) {
    L.weights_proj = m(a + "indexer.weights_proj.weight", {IH, hidden});
  }
  L.post_norm = w(p + "post_attention_layernorm.weight", {hidden});
  if (!c.layer_is_moe(l)) {  // MoE layers' weights live in moe_
    L.gate_up = m(p + "mlp.gate_up_proj.weight", {2 * inter, hidden});
    L.down = m(p + "mlp.down_proj.weight", {hidden, inter});
  }
  return L;
}

void Model::forward(const StepView& step, KvCache& cache, const StepOptions& options) {
  require(step.rows >= 1 && step.rows <= max_rows_, ErrorCode::kInvalidArgument,
          "step has {} rows, the model was sized for 1..{}", step.rows, max_rows_);
  require(cache.config().num_layers == config_.num_hidden_layers, ErrorCode::kInvalidArgument,
          "cache has {} layers, the model {}", cache.config().num_layers,
          config_.num_hidden_layers);
  Backend& be = *backend_;
  // However the step ends, later work goes to the main lane, after all the side lane's.
  struct MainLaneAtExit {
    Backend& be;
    ~MainLaneAtExit() {
      try {
        be.set_lane(Backend::Lane::kMain);
        be.lane_wait(Backend::Lane::kMain, Backend::Lane::kSide);
      } catch (const std::exception& e) {  // a device error: the next synchronize() reports it
        spdlog::error("model: joining the side lane after the step failed: {}", e.what());
      }
    }
  } main_lane_at_exit{be};
  const int R = step.rows, hidden = config_.hidden_size;
  const int64_t vocab = config_.vocab_size;
  be.embed({step.tokens, weights_.get("model.embed_tokens.weight", {vocab, hidden}), h_.data(), R,
            config_.vocab_size, hidden, hidden});
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    attention(l, step, cache, options);
    mlp(l, R);
  }
  rmsnorm(be, h_.data(), hidden, x_.data(), hidden, weights_.get("model.norm.weight", {hidden}), R,
          hidden, config_.rms_norm_eps, x_bf16_.data());
  linear(be, x_.data(), hidden, weights_.matrix("lm_head.weight", {vocab, hidden}),
         config_.vocab_size, hidden, step.logits, vocab, R, kOverwrite, 1, x_bf16_.data());
}

void Model::attention(int l, const StepView& step, KvCache& cache, const StepOptions& options) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const LayerPtrs& L = layers_[l];
  const int R = step.rows, hidden = c.hidden_size, qlr = c.q_lora_rank;
  const int H = c.num_attention_heads, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const double eps = c.rms_norm_eps;

  // 1. MLA projections: q = W_qb(norm(W_qa x)), kv = W_kva x (latent normed), RoPE on rope parts.
  // W_qa x, the indexer's W_ik x and W_kva x are one GEMM (x_proj) into xp_; W_qb and the
  // indexer's W_iq over norm(W_qa x) another (q_up) into qq_.
  const Fp8Rows x8 = act_fp8(L.x_proj, hidden);
  rmsnorm(be, h_.data(), hidden, x_.data(), hidden, L.input_norm, R, hidden, eps, x_bf16_.data(),
          x8);
  const int64_t xp_ld = xp_cols(), qq_ld = qq_cols();
  linear(be, x_.data(), hidden, L.x_proj, int(xp_ld), hidden, xp_.data(), xp_ld, R, kOverwrite, 1,
         x_bf16_.data(), x8);

  // The lanes (Backend::set_lane). The side lane takes the stores and the indexer: it starts once
  // x_proj is done (the latent store, the index key's store and the head weights, beside the main
  // lane's q_a norm and q_up), goes on once q_up is done (the index query, logits and top-k,
  // beside the main lane's RoPE and absorb) and is joined before sparse MLA. The lanes touch
  // disjoint memory while unordered: x_proj's columns are split between them (q_a: main; the
  // index key and the latent, normed in place: side), and so are q_up's (the heads' q: main; the
  // index query, rotated in place: side); each lane has its own GEMM scratch.
  using Lane = Backend::Lane;
  be.lane_wait(Lane::kSide, Lane::kMain);
  be.set_lane(Lane::kSide);
  // 2. The latent normed and the key roped in place, then the guarded latent store: one op.
  float* kv = xp_.data() + qlr + kIndexHeadDim;
  LatentKvParams latent;
  latent.kv = kv;
  latent.ld_kv = xp_ld;
  latent.norm_weight = L.kv_a_norm;
  latent.eps = float(eps);
  latent.positions = step.positions;
  latent.cos_sin = cos_sin_.data();
  latent.max_position = max_context_;
  latent.batch = {step.slots, step.n_real, R, step.error_count};
  latent.pool = cache.latent(l);
  be.latent_kv(latent);
  record_store_inputs(l, PoolKind::kLatent, step, latent.pool, kv, xp_ld);
  // 3. The indexer's key, its guarded store, and its head weights.
  indexer_key_and_weights(l, step, cache, options);
  be.set_lane(Lane::kMain);

  const Fp8Rows qa8 = act_fp8(L.q_up, qlr);
  rmsnorm(be, xp_.data(), xp_ld, qa_.data(), qlr, L.q_a_norm, R, qlr, eps, qa_bf16_.data(), qa8);
  linear(be, qa_.data(), qlr, L.q_up, int(qq_ld), qlr, qq_.data(), qq_ld, R, kOverwrite, 1,
         qa_bf16_.data(), qa8);

  // 4-6. The indexer's query, logits and top-k: the selected slots land in topk_slots_.
  be.lane_wait(Lane::kSide, Lane::kMain);
  be.set_lane(Lane::kSide);
  indexer_select(l, step, cache);
  be.set_lane(Lane::kMain);

  // RoPE on q's rope parts, which are also copied into the attention query's (q_attn = q_lat ‖
  // q_rope per head); the absorb below fills the q_lat parts.
  RopeParams q_rope{qq_.data(), step.positions, cos_sin_.data(),        R, H, qq_ld, qk, nope,
                    kRopeDim,   max_context_,   RopeStyle::kInterleaved};
  q_rope.out = q_attn_.data() + kKvLoraRank;
  q_rope.ld_out_row = int64_t(H) * kLatentDim;
  q_rope.ld_out_head = kLatentDim;
  be.rope(q_rope);

  // 7. Absorbed sparse MLA: q_lat[h] = q_nope[h] W_UK[h]; attend; o[h] = W_UV[h] o_lat[h].
  const int64_t kv_b_head = int64_t(nope + c.v_head_dim) * kKvLoraRank;  // rows of one head
  GemmParams absorb;
  absorb.x = qq_.data();
  absorb.w = L.kv_b;
  absorb.y = q_attn_.data();
  absorb.m = R;
  absorb.n = kKvLoraRank;
  absorb.k = nope;
  absorb.batch = H;
  absorb.ld_x = qq_ld;
  absorb.ld_w = kKvLoraRank;
  absorb.ld_y = int64_t(H) * kLatentDim;
  absorb.batch_stride_x = qk;
  absorb.batch_stride_w = kv_b_head;
  absorb.batch_stride_y = kLatentDim;
  absorb.layout = WeightLayout::kKN;
  absorb.w_constant = true;
  be.gemm(absorb);
  be.lane_wait(Lane::kMain, Lane::kSide);  // the selected slots and both stores are done

  SparseMlaParams attn;
  attn.q = q_attn_.data();
  attn.indices = topk_slots_.data();
  attn.out = o_lat_.data();
  attn.pool = cache.latent(l);
  attn.rows = R;
  attn.heads = H;
  attn.topk = c.index_topk;
  attn.ld_q = int64_t(H) * kLatentDim;
  attn.ld_indices = c.index_topk;
  attn.ld_out = int64_t(H) * kKvLoraRank;
  attn.scale = c.softmax_scale();
  be.sparse_mla(attn);

  GemmParams up;
  up.x = o_lat_.data();
  up.w = L.kv_b + int64_t(nope) * kKvLoraRank;
  up.y = o_.data();
  up.m = R;
  up.n = c.v_head_dim;
  up.k = kKvLoraRank;
  up.batch = H;
  up.ld_x = int64_t(H) * kKvLoraRank;
  up.ld_w = kKvLoraRank;
  up.ld_y = int64_t(H) * c.v_head_dim;
  up.batch_stride_x = kKvLoraRank;
  up.batch_stride_w = kv_b_head;
  up.batch_stride_y = c.v_head_dim;
  up.w_constant = true;
  be.gemm(up);
  linear(be, o_.data(), int64_t(H) * c.v_head_dim, L.o, hidden, H * c.v_head_dim, h_.data(), hidden,
         R, GemmOutput::kAccumulate);
}

namespace {
RopeStyle indexer_rope_style(const ModelConfig& c) {
  return c.indexer_rope_interleave ? RopeStyle::kInterleaved : RopeStyle::kHalfSplit;
}
float indexer_hadamard_scale() { return float(1.0 / std::sqrt(double(kIndexHeadDim))); }
// The head weights' scale, index_n_heads^-1/2 * index_head_dim^-1/2.
float indexer_weights_scale(const ModelConfig& c) {
  return float(1.0 / std::sqrt(double(c.index_n_heads) * kIndexHeadDim));
}
}  // namespace

void Model::indexer_key_and_weights(int l, const StepView& step, KvCache& cache,
                                    const StepOptions& options) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const LayerPtrs& L = layers_[l];
  const int R = step.rows, hidden = c.hidden_size, IH = c.index_n_heads;
  // k_i = Hadamard(RoPE(LayerNorm(W_ik x))) (xp_, after q_a), and its guarded store, in one op.
  const int64_t xp_ld = xp_cols();
  float* ki = xp_.data() + c.q_lora_rank;
  IndexerKeyParams key;
  key.x = key.k = ki;
  key.ld_x = key.ld_k = xp_ld;
  key.norm_weight = L.k_norm_w;
  key.norm_bias = L.k_norm_b;
  key.eps = 1e-6f;
  key.positions = step.positions;
  key.cos_sin = cos_sin_.data();
  key.max_position = max_context_;
  key.style = indexer_rope_style(c);
  key.hadamard_scale = indexer_hadamard_scale();
  key.batch = {step.slots, step.n_real, R, step.error_count};
  key.pool = cache.index_k(l);
  key.guard = options.index_k_guard;
  be.indexer_key(key);
  record_store_inputs(l, PoolKind::kIndexK, step, key.pool, ki, xp_ld);
  // w = W_iw x * index_n_heads^-1/2 * index_head_dim^-1/2: W_iw x is x_proj's last part (bf16
  // weights; the scale is applied by indexer_logits), or its own GEMM with the scale as alpha.
  if (!index_weights_in_x_proj_) {
    linear(be, x_.data(), hidden, L.weights_proj, IH, hidden, wi_.data(), IH, R, kOverwrite,
           indexer_weights_scale(c), x_bf16_.data());
  }
}

void Model::indexer_select(int l, const StepView& step, KvCache& cache) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const int R = step.rows, IH = c.index_n_heads;
  // q_i = Hadamard(RoPE(W_iq(norm(W_qa x)))) (qq_, after q), rotated in place.
  const int64_t xp_ld = xp_cols(), qq_ld = qq_cols();
  float* qi = qq_.data() + int64_t(c.num_attention_heads) * c.qk_head_dim();
  // With an fp8 cache, the query's encoding too, once per row, where indexer_logits reads it.
  const bool encode = cache.index_k(l).dtype == KvDtype::kFp8 && be.reads_fp8_index_query();
  IndexerQueryParams query{qi,
                           qq_ld,
                           R,
                           IH,
                           step.positions,
                           cos_sin_.data(),
                           max_context_,
                           indexer_rope_style(c),
                           indexer_hadamard_scale()};
  if (encode) {
    query.q_fp8 = index_q_fp8_.data();
    query.q_fp8_scale = index_q_scale_.data();
    query.ld_q_fp8 = int64_t(IH) * kIndexHeadDim;
  }
  be.indexer_query(query);
  IndexerLogitsParams lp;
  if (index_weights_in_x_proj_) {
    lp.w = xp_.data() + c.q_lora_rank + kIndexHeadDim + kLatentDim;
    lp.ld_w = xp_ld;
    lp.w_scale = indexer_weights_scale(c);
  } else {  // indexer_key_and_weights' GEMM, scaled there
    lp.w = wi_.data();
    lp.ld_w = IH;
  }
  lp.q = qi;
  lp.q_fp8 = query.q_fp8;
  lp.q_fp8_scale = query.q_fp8_scale;
  lp.ld_q_fp8 = query.ld_q_fp8;
  lp.page_table = step.page_table;
  lp.seq_lens = step.seq_lens;
  lp.logits = index_logits_.data();
  lp.pool = cache.index_k(l);
  lp.rows = R;
  lp.heads = IH;
  lp.ld_q = qq_ld;
  lp.ld_page_table = step.ld_page_table;
  lp.ld_logits = max_context_;
  lp.error_count = step.error_count;
  be.indexer_logits(lp);

  TopkParams tp;
  tp.logits = index_logits_.data();
  tp.seq_lens = step.seq_lens;
  tp.out_positions = topk_positions_.data();
  tp.out_slots = topk_slots_.data();
  tp.page_table = step.page_table;
  tp.rows = R;
  tp.k = c.index_topk;
  tp.ld_logits = max_context_;
  tp.ld_page_table = step.ld_page_table;
  be.topk(tp);
}

void Model::record_store_inputs(int l, PoolKind kind, const StepView& step, const PoolView& pool,
                                const float* values, int64_t ld) {
  Backend& be = *backend_;
  const int R = step.rows;
  const bool latent = kind == PoolKind::kLatent;
  if (step.write_digests) {
    DigestRowsParams d;
    d.kind = kind;
    d.values = values;
    d.k_rope = latent ? values + kKvLoraRank : nullptr;
    d.ld_values = d.ld_rope = ld;
    d.n_real = step.n_real;
    d.rows = R;
    d.dtype = pool.dtype;
    d.rounding = pool.rounding;
    d.digests = step.write_digests + (int64_t(l) * 2 + (latent ? 0 : 1)) * R;
    be.digest_rows(d);
  }
  if (step.store_values) {
    float* dst = step.store_values + int64_t(l) * R * kStoreValuesDim + (latent ? 0 : kLatentDim);
    be.copy_rows({values, dst, R, latent ? kLatentDim : kIndexHeadDim, ld, kStoreValuesDim});
  }
}

void Model::mlp(int l, int rows) {
  Backend& be = *backend_;
  const ModelConfig& c = config_;
  const LayerPtrs& L = layers_[l];
  const int hidden = c.hidden_size, inter = c.intermediate_size;
  const bool moe = c.layer_is_moe(l);
  const Fp8Rows x8 = moe ? Fp8Rows{} : act_fp8(L.gate_up, hidden);
  rmsnorm(be, h_.data(), hidden, x_.data(), hidden, L.post_norm, rows, hidden, c.rms_norm_eps,
          x_bf16_.data(), x8);
  if (moe) {
    moe_->forward(l, x_.data(), h_.data(), rows);
    return;
  }
  linear(be, x_.data(), hidden, L.gate_up, 2 * inter, hidden, gate_up_.data(), 2 * inter, rows,
         kOverwrite, 1, x_bf16_.data(), x8);
  SwigluParams act{gate_up_.data(), act_.data(), rows, inter, 2 * inter, inter};
  act.out_fp8 = act_fp8(L.down, inter);
  be.swiglu(act);
  linear(be, act_.data(), inter, L.down, hidden, inter, h_.data(), hidden, rows,
         GemmOutput::kAccumulate, 1, nullptr, act.out_fp8);
}

}  // namespace dsa
