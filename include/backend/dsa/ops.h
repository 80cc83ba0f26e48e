// One params struct per op, with the shape on every pointer. Includable from CUDA code.
//
// Conventions, for every op and every backend:
//   - Pointers live in the backend's memory (host for CPU, device for CUDA).
//   - Activations are f32; weights are bf16; caches are bf16 or fp8 (see slot.h).
//   - Row counts (rows, batch) are host integers fixed at launch, so a step can be captured in a
//     graph. Per-row data that changes between replays (slots, seq_lens, positions, n_real) is
//     read from memory by the op.
//   - `ld_*` is a row stride in elements. Every op is row-independent (batch-invariant): a row's
//     result depends only on that row's inputs, the weights and the cache.
#pragma once

#include <cstdint>

#include "dsa/dtype.h"
#include "dsa/slot.h"

namespace dsa {

// Rows of f32 values quantized per 128-column block by the group encoder (encode_fp8_group,
// dsa/token_codec.h, exact scale rounding: DeepSeek's act_quant): e4m3 codes [rows, cols] with
// row stride ld bytes, and block b's scale of row r at scales[b * ld_scales + r] (block-major, so
// a block's rows are contiguous). Past cols a block's values count as 0. The operand of a GEMM
// with fp8 activations (GemmParams::x_fp8): a producer given one (RmsNormParams::y_fp8,
// SwigluParams::out_fp8) writes these codes and scales of exactly the values it writes, and
// GemmParams::x8 hands them to the GEMM, which then skips its own quantization of x.
struct Fp8Rows {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t ld = 0, ld_scales = 0;  // ld >= cols; ld_scales >= rows
};
inline constexpr int kFp8BlockCols = 128;

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight; y_bf16 = bf16(y) when set, the
// operand the bf16 GEMM modes read (GemmParams::x_bf16), so no separate conversion runs; y_fp8
// (codes set) = y per 128-column block, the operand of the w8a8 GEMM (GemmParams::x8).
struct RmsNormParams {
  const float* x = nullptr;      // [rows, dim], row stride ld_x
  float* y = nullptr;            // [rows, dim], row stride ld_y (may alias x)
  const Bf16* weight = nullptr;  // [dim]
  int rows = 0, dim = 0;
  int64_t ld_x = 0, ld_y = 0;
  float eps = 1e-6f;
  Bf16* y_bf16 = nullptr;  // [rows, dim], row stride ld_y_bf16; optional
  int64_t ld_y_bf16 = 0;
  Fp8Rows y_fp8 = {};  // optional: y's codes and block scales
};

// y[r, :] = (x - mean) / sqrt(var + eps) * weight + bias   (biased variance)
struct LayerNormParams {
  const float* x = nullptr;      // [rows, dim], row stride ld_x
  float* y = nullptr;            // [rows, dim], row stride ld_y (may alias x)
  const Bf16* weight = nullptr;  // [dim]
  const Bf16* bias = nullptr;    // [dim], or null for no bias
  int rows = 0, dim = 0;
  int64_t ld_x = 0, ld_y = 0;
  float eps = 1e-6f;
};

enum class RopeStyle : uint8_t {
  kInterleaved,  // pairs (2i, 2i+1): MLA's convention
  kHalfSplit,    // pairs (i, i + rope_dim/2): the indexer's convention (DESIGN §1.3)
};

// Rotates dims [offset, offset + rope_dim) of every head, in place, by the angle of the row's
// position. The angles come from a host-built table, so both backends use identical cos/sin.
struct RopeParams {
  float* x = nullptr;                  // [rows, heads, *], row stride ld_row, head stride ld_head
  const int32_t* positions = nullptr;  // [rows] token positions, each < max_position
  const float* cos_sin = nullptr;      // [max_position, rope_dim/2, 2] (cos, sin)
  int rows = 0, heads = 0;
  int64_t ld_row = 0, ld_head = 0;
  int offset = 0, rope_dim = 0;
  int max_position = 0;  // a position >= max_position leaves the row unrotated
  RopeStyle style = RopeStyle::kInterleaved;
  // Optional: rope then copy_rows in one op. After the rotation, dims [offset, offset + rope_dim)
  // of head h of row r are also written to out + r * ld_out_row + h * ld_out_head (an unrotated
  // row is copied as it is). out must not overlap x.
  float* out = nullptr;
  int64_t ld_out_row = 0, ld_out_head = 0;
};

// x[r, :] = scale * H_dim x[r, :] with the Sylvester-ordered Walsh-Hadamard matrix, in place.
struct HadamardParams {
  float* x = nullptr;  // [rows, dim], row stride ld; dim is a power of two, <= 1024
  int rows = 0, dim = 0;
  int64_t ld = 0;
  float scale = 1.0f;
};

enum class WeightLayout : uint8_t {
  kNK,  // w[n, k]: y = x * w^T (nn.Linear's layout)
  kKN,  // w[k, n]: y = x * w
};
enum class GemmOutput : uint8_t { kOverwrite, kAccumulate };

// For each b in [0, batch): y_b[m, n] (+)= alpha * sum_k x_b[m, k] * w_b(n, k).
// Accumulation is f32 in ascending k on the CPU; x is used as f32 (not rounded to bf16). On CUDA
// the GemmMode decides (backend.h): kExact is the CPU's bits, kBatchInvariant and kFast round x
// to bf16 and sum in their own order.
// x_bf16, when set (batch 1 only), must hold bf16(x) (dsa::float_to_bf16 of every element): the
// bf16 modes read it instead of converting x themselves; the CPU and kExact ignore it.
//
// The weights are bf16 (w) or fp8 e4m3 with 128 x 128 block scales (w_fp8 + w_scale, as DeepSeek
// checkpoints store projections): exactly one of w and w_fp8 is set. An fp8 weight's value is
// w(n, k) = dequant_fp8_weight(w_fp8[n, k], w_scale[n / 128][k / 128]) (dsa/dtype.h: bf16 of the
// f32 product), so every mode gives exactly the bits it gives for w = that dequantized bf16
// matrix; only the bytes read differ (half). fp8 weights: layout kNK, batch 1, and every scale
// finite (a zero byte past k must stay +0: the kernels zero-fill partial tiles with it). kExact
// and kFast on CUDA refuse them (backend.h, GemmMode).
//
// x_fp8 (fp8 weights only: DeepSeek's w8a8 inference numerics, `--weights w8a8`): x is quantized
// too, per row and 128-wide k block kb (the weights' scale blocks), by the group encoder
// (encode_fp8_group, dsa/token_codec.h: s_x = fp8_scale_for_amax(max |x|, exact), codes
// e4m3(x / s_x)), and the products are of codes:
//   P[m, n, kb] = sum over k in kb of fp8(xq[m, k]) * fp8(w_fp8[n, k])   (exact products, f32 sum)
//   y[m, n] (+)= alpha * sum over kb, ascending, of P[m, n, kb] * (s_x[m, kb] * w_scale[n/128][kb])
// The CPU sums P in ascending k and adds the blocks as written; CUDA (kBatchInvariant only: kExact
// and kFast refuse it) takes P from the e4m3 tensor core (its own accumulation, within a stated
// bound of the CPU's) and the block sums with one fma each, in the same ascending order per K
// slice. Nothing is dequantized: the weights' bytes go to the tensor cores as they are stored.
// x8 (codes set, with x_fp8): x as its producer quantized it (Fp8Rows), which the GEMM reads
// instead of quantizing x itself; it must hold exactly that quantization of x, so the result is
// the same bits either way. CUDA needs its codes 16-byte aligned with ld a multiple of 16, and
// its scales 8-byte aligned with ld_scales even.
struct GemmParams {
  const float* x = nullptr;  // [batch][m, k], row stride ld_x, batch stride batch_stride_x
  const Bf16* w = nullptr;   // [batch][n, k] or [batch][k, n] per layout, row stride ld_w
  float* y = nullptr;        // [batch][m, n], row stride ld_y
  int m = 0, n = 0, k = 0, batch = 1;
  int64_t ld_x = 0, ld_w = 0, ld_y = 0;
  int64_t batch_stride_x = 0, batch_stride_w = 0, batch_stride_y = 0;
  WeightLayout layout = WeightLayout::kNK;
  GemmOutput output = GemmOutput::kOverwrite;
  float alpha = 1.0f;
  const Bf16* x_bf16 = nullptr;  // [m, k], row stride ld_x_bf16; optional
  int64_t ld_x_bf16 = 0;
  const uint8_t* w_fp8 = nullptr;  // instead of w: [n, k] e4m3 bytes, row stride ld_w
  const float* w_scale = nullptr;  // with w_fp8: [ceil(n / 128), ceil(k / 128)], row stride
  int64_t ld_w_scale = 0;          // ld_w_scale (>= ceil(k / 128))
  bool x_fp8 = false;              // with w_fp8: quantize x to e4m3 per 128-k block (above)
  Fp8Rows x8 = {};                 // with x_fp8: x already quantized (above); optional
  // w (or w_fp8 and w_scale) is written by no kernel this stream runs before the call (model
  // weights): a CUDA kernel may start copying it before its programmatic wait (DSA_CUDA_PDL=on,
  // src/backend/cuda/pdl.h). Never set it for an operand some earlier kernel produces.
  bool w_constant = false;
};
inline constexpr int kGemmFp8Block = 128;  // the w_scale block: 128 x 128 weights

// out[r, i] = silu(gate[r, i]) * up[r, i], where gate_up[r] = gate ‖ up; out_fp8 (codes set) =
// out per 128-column block (Fp8Rows), the down projection's operand with fp8 activations.
struct SwigluParams {
  const float* gate_up = nullptr;  // [rows, 2 * inter], row stride ld_in
  float* out = nullptr;            // [rows, inter], row stride ld_out
  int rows = 0, inter = 0;
  int64_t ld_in = 0, ld_out = 0;
  Fp8Rows out_fp8 = {};  // optional: out's codes and block scales
};

// x[r, :] = softmax(x[r, :]) in place, over the first cols entries.
struct SoftmaxParams {
  float* x = nullptr;  // [rows, cols], row stride ld
  int rows = 0, cols = 0;
  int64_t ld = 0;
};

// out[r, :] = table[tokens[r], :]; a token outside [0, vocab) gives a zero row.
struct EmbedParams {
  const int32_t* tokens = nullptr;  // [rows]
  const Bf16* table = nullptr;      // [vocab, dim]
  float* out = nullptr;             // [rows, dim], row stride ld_out
  int rows = 0, vocab = 0, dim = 0;
  int64_t ld_out = 0;
};

// y[r, :] += x[r, :]
struct AddParams {
  const float* x = nullptr;  // [rows, dim], row stride ld_x
  float* y = nullptr;        // [rows, dim], row stride ld_y
  int rows = 0, dim = 0;
  int64_t ld_x = 0, ld_y = 0;
};

// y[r, :dim] = x[r, :dim]: a strided row copy (e.g. the rope part of q into the attention query).
struct CopyRowsParams {
  const float* x = nullptr;  // [rows, dim], row stride ld_x
  float* y = nullptr;        // [rows, dim], row stride ld_y
  int rows = 0, dim = 0;
  int64_t ld_x = 0, ld_y = 0;
};

// ---- MoE routing (DESIGN §1.8) ----------------------------------------------------------------

// DeepSeek-V3 routing of each row over n_experts routed experts:
//   score[e] = sigmoid(logits[r, e]) (f32); the top_k experts by score[e] + bias[e] are selected
//   (ties to the lower expert id; a NaN choice score ranks below every number);
//   weight[e] = score[e] / sum of the selected scores * scaling for selected e, else exactly 0.
// Expert groups (n_group / topk_group) are not modelled: every expert is one group.
inline constexpr int kMaxRoutedExperts = 256;  // DeepSeek-V3's count; kernels keep a bit mask

struct MoeRouteParams {
  const float* logits = nullptr;  // [rows, n_experts] router logits, row stride ld_logits
  const Bf16* bias = nullptr;     // [n_experts] e_score_correction_bias, or null for none
  float* weights = nullptr;       // [rows, n_experts] dense combine weights, row stride ld_weights
  int32_t* expert_ids = nullptr;  // [rows, top_k] selected ids, best first (optional)
  int rows = 0, n_experts = 0, top_k = 0;
  int64_t ld_logits = 0, ld_weights = 0, ld_expert_ids = 0;
  float scaling = 1.0f;  // routed_scaling_factor
};

// x[r, :dim] *= scale[r * ld_scale], in place: one expert's per-row combine weight.
struct ScaleRowsParams {
  float* x = nullptr;            // [rows, dim], row stride ld_x
  const float* scale = nullptr;  // [rows] with stride ld_scale (a column of MoE weights)
  int rows = 0, dim = 0;
  int64_t ld_x = 0, ld_scale = 1;
};

// ---- The store contract (DESIGN §3) -----------------------------------------------------------

// The two pools of a layer.
enum class PoolKind : uint8_t { kLatent, kIndexK };

// The slot map of one step. A writer processes exactly `rows` rows, never the value tensor's row
// count, and writes row r only when judge_slot(r, *n_real, slots[r], capacity) == kWrite.
struct SlotBatch {
  const int64_t* slots = nullptr;   // [rows] physical slots; kPadSlot for padded rows
  const int32_t* n_real = nullptr;  // [1] count of real rows, read on the device
  int rows = 0;                     // len(slot map)
  int32_t* error_count = nullptr;   // [1] the step's error flag: += 1 per rule-4 / bad slot
};

// How the bf16 index-K writer treats its slots. kIncidentScatter exists only to reproduce the
// incident (DESIGN §5): it ignores rules 1-3 and wraps a negative slot from the end of the pool.
enum class StoreGuard : uint8_t { kEnforced, kIncidentScatter };

// The keys come as float32 (k) or as bf16 (k_bf16, what engines hold): exactly one is set, and
// ld_k is in elements of that one. From bf16 the bf16 layout stores each value as it is (bit for
// bit) and the fp8 layout quantizes its exact f32 widening: the bytes of the f32 path on those
// widened values (encode_index_k_token, dsa/token_codec.h).
struct StoreIndexKParams {
  SlotBatch batch;
  const float* k = nullptr;  // [batch.rows, 128], row stride ld_k
  int64_t ld_k = 0;
  PoolView pool;  // index-K layout, bf16 or fp8
  StoreGuard guard = StoreGuard::kEnforced;
  const Bf16* k_bf16 = nullptr;  // instead of k: [batch.rows, 128] bf16, row stride ld_k
};

struct StoreLatentKvParams {
  SlotBatch batch;
  const float* latent = nullptr;  // [batch.rows, 512] c (already normed), row stride ld_latent
  const float* k_rope = nullptr;  // [batch.rows, 64] roped key, row stride ld_rope
  int64_t ld_latent = 0, ld_rope = 0;
  PoolView pool;  // latent layout, bf16 or fp8
};

// digests[r] = the slot digest that row r's store inputs encode to in the pool's layout
// (index_k_values_digest / latent_values_digest of dsa/slot_digest.h: the writers' encoder, then
// the auditor's digest) for r < *n_real, and 0 for r >= *n_real. Run beside each store, it gives
// the auditor the truth of every slot a real row wrote from what the row meant to write.
struct DigestRowsParams {
  PoolKind kind = PoolKind::kLatent;
  const float* values =
      nullptr;  // [rows, 128] index keys, or [rows, 512] latent c; stride ld_values
  const float* k_rope = nullptr;  // [rows, 64] roped keys (latent only), row stride ld_rope
  int64_t ld_values = 0, ld_rope = 0;
  const int32_t* n_real = nullptr;  // [1] real rows, read on the device
  int rows = 0;
  KvDtype dtype = KvDtype::kBf16;  // the pool's encoding
  ScaleRounding rounding = ScaleRounding::kExact;
  uint64_t* digests = nullptr;  // [rows] out
};

// The indexer's key path in one op: k = hadamard(rope(layernorm(x))) * hadamard_scale, written to
// k, then the guarded index-K store of k. It is by definition the composition of four ops,
//   layernorm(x -> k), rope(dims [0, 64) of k's one head), hadamard(k), store_index_k(k),
// with the params indexer_key_parts gives: the same bits as those ops run one after another (on
// the same backend), in one launch where the backend can. Rows are batch.rows.
struct IndexerKeyParams {
  const float* x = nullptr;  // [rows, 128] the key projection, row stride ld_x
  float* k = nullptr;        // [rows, 128] out: the keys the store encodes (may alias x)
  int64_t ld_x = 0, ld_k = 0;
  const Bf16* norm_weight = nullptr;  // [128]
  const Bf16* norm_bias = nullptr;    // [128], or null for no bias
  float eps = 1e-6f;
  const int32_t* positions = nullptr;  // [rows]
  const float* cos_sin = nullptr;      // [max_position, 32, 2], as RopeParams::cos_sin
  int max_position = 0;
  RopeStyle style = RopeStyle::kHalfSplit;
  float hadamard_scale = 1.0f;
  SlotBatch batch;  // the slot map; batch.rows rows
  PoolView pool;    // index-K layout, bf16 or fp8
  StoreGuard guard = StoreGuard::kEnforced;
};

struct IndexerKeyParts {
  LayerNormParams norm;
  RopeParams rope;
  HadamardParams hadamard;
  StoreIndexKParams store;
};

// The four ops indexer_key stands for.
inline IndexerKeyParts indexer_key_parts(const IndexerKeyParams& p) {
  constexpr int kDim = kIndexHeadDim;
  IndexerKeyParts parts;
  const int rows = p.batch.rows;
  parts.norm = {p.x, p.k, p.norm_weight, p.norm_bias, rows, kDim, p.ld_x, p.ld_k, p.eps};
  parts.rope = {p.k,  p.positions, p.cos_sin, rows,           1,      p.ld_k,
                kDim, 0,           kRopeDim,  p.max_position, p.style};
  parts.hadamard = {p.k, rows, kDim, p.ld_k, p.hadamard_scale};
  parts.store.batch = p.batch;
  parts.store.k = p.k;
  parts.store.ld_k = p.ld_k;
  parts.store.pool = p.pool;
  parts.store.guard = p.guard;
  return parts;
}

// The MLA's latent path in one op: c = rmsnorm(kv[:, :512]) in place, k_rope = rope(kv[:, 512:]) in
// place (interleaved pairs), then the guarded latent store of (c, k_rope). By definition the
// composition rmsnorm -> rope -> store_latent_kv with the params latent_kv_parts gives.
struct LatentKvParams {
  float* kv = nullptr;  // [rows, 576] c ‖ k_rope, row stride ld_kv; normed and roped in place
  int64_t ld_kv = 0;
  const Bf16* norm_weight = nullptr;  // [512]
  float eps = 1e-6f;
  const int32_t* positions = nullptr;  // [rows]
  const float* cos_sin = nullptr;      // [max_position, 32, 2], as RopeParams::cos_sin
  int max_position = 0;
  SlotBatch batch;  // the slot map; batch.rows rows
  PoolView pool;    // latent layout, bf16 or fp8
};

struct LatentKvParts {
  RmsNormParams norm;
  RopeParams rope;
  StoreLatentKvParams store;
};

inline LatentKvParts latent_kv_parts(const LatentKvParams& p) {
  LatentKvParts parts;
  const int rows = p.batch.rows;
  parts.norm = {p.kv, p.kv, p.norm_weight, rows, kKvLoraRank, p.ld_kv, p.ld_kv, p.eps};
  parts.rope = {p.kv,
                p.positions,
                p.cos_sin,
                rows,
                1,
                p.ld_kv,
                kLatentDim,
                kKvLoraRank,
                kRopeDim,
                p.max_position,
                RopeStyle::kInterleaved};
  parts.store.batch = p.batch;
  parts.store.latent = p.kv;
  parts.store.k_rope = p.kv + kKvLoraRank;
  parts.store.ld_latent = parts.store.ld_rope = p.ld_kv;
  parts.store.pool = p.pool;
  return parts;
}

// The indexer's query path in one op: for each of `heads` 128-wide heads of each row, rope on dims
// [0, 64) then hadamard * scale, in place. By definition rope -> hadamard with the params of
// indexer_query_parts (with a row stride past the packed heads, the hadamard part once per row).
// With q_fp8 set it also writes each head's fp8 encoding of the result, the one indexer_logits
// makes of q for an fp8 cache (below: e4m3(q / s_q), s_q = max(amax, 1e-4) / 448, exact): the 128
// e4m3 bytes at q_fp8 + r * ld_q_fp8 + h * 128 and s_q at q_fp8_scale[r * heads + h]. Handing
// them to indexer_logits spares its blocks encoding the row again; it changes no bit.
struct IndexerQueryParams {
  float* q = nullptr;  // [rows, heads, 128], row stride ld_q >= heads * 128, head stride 128
  int64_t ld_q = 0;
  int rows = 0, heads = 0;
  const int32_t* positions = nullptr;  // [rows]
  const float* cos_sin = nullptr;      // [max_position, 32, 2]
  int max_position = 0;
  RopeStyle style = RopeStyle::kHalfSplit;
  float hadamard_scale = 1.0f;
  uint8_t* q_fp8 = nullptr;      // optional: [rows, ld_q_fp8 >= heads * 128] e4m3
  float* q_fp8_scale = nullptr;  // with q_fp8: [rows, heads] s_q
  int64_t ld_q_fp8 = 0;
};

struct IndexerQueryParts {
  RopeParams rope;
  HadamardParams hadamard;
};

// The hadamard part treats the heads as rows: all rows' heads when ld_q == heads * 128 (packed
// rows); else it is one row's heads (q at row 0), and the op runs it once per row, q moved by ld_q.
inline IndexerQueryParts indexer_query_parts(const IndexerQueryParams& p) {
  IndexerQueryParts parts;
  parts.rope = {p.q,           p.positions, p.cos_sin, p.rows,         p.heads, p.ld_q,
                kIndexHeadDim, 0,           kRopeDim,  p.max_position, p.style};
  const bool packed = p.ld_q == int64_t(p.heads) * kIndexHeadDim;
  parts.hadamard = {p.q, packed ? p.rows * p.heads : p.heads, kIndexHeadDim, kIndexHeadDim,
                    p.hadamard_scale};
  return parts;
}

// ---- Indexer, top-k, sparse attention (DESIGN §1.5-7) ----------------------------------------

// logits[r, t] = sum_h w[r, h] * relu(q[r, h, :] . k[t, :]) for t < seq_lens[r]; t >= seq_len is
// never written. The token t of row r lives at slot page_table[r, t / 64] * 64 + t % 64.
// A page id outside [0, pool.num_pages) is never read: its tokens' logits are 0 and the row adds
// 1 to *error_count per such page (both backends alike).
//   bf16 cache: q is rounded to bf16; k is bf16; dot products accumulate in f32.
//   fp8 cache:  q[r, h] is quantized to e4m3 with its own scale s_q = max(amax, 1e-4) / 448
//               (exact rounding), s_q is folded into w, and the logit is
//               k_scale[t] * sum_h (w * s_q) * relu(q8 . k8).
// The head weight w[r, h] is w_scale * (the stored value), one f32 multiply: w_scale carries the
// weights' scale (index_n_heads^-1/2 index_head_dim^-1/2) when w is the raw projection, exactly
// what a GEMM's alpha = w_scale would have given.
struct IndexerLogitsParams {
  const float* q = nullptr;             // [rows, heads, 128], row stride ld_q (head stride 128)
  const float* w = nullptr;             // [rows, heads] head weights, row stride ld_w
  float w_scale = 1.0f;                 // multiplies every w
  const int32_t* page_table = nullptr;  // [rows, ld_page_table] page ids
  const int32_t* seq_lens = nullptr;    // [rows] cached tokens per row; 0 for a padded row
  float* logits = nullptr;              // [rows, ld_logits], ld_logits >= max seq_len
  PoolView pool;                        // index-K layout
  int rows = 0, heads = 0;
  int64_t ld_q = 0, ld_w = 0, ld_page_table = 0, ld_logits = 0;
  int32_t* error_count = nullptr;  // [1] the step's error flag: += 1 per bad page id (optional)
  // Optional, fp8 caches: q's fp8 encoding as indexer_query writes it (q_fp8 set there), which
  // must be the encoding of q above. A kernel may read it instead of encoding q itself (CUDA's
  // default fp8 kernel, wgmma-e4m3, does); the logits are the same bits either way. The CPU
  // reads q.
  const uint8_t* q_fp8 = nullptr;      // [rows, ld_q_fp8] e4m3, head h at h * 128
  const float* q_fp8_scale = nullptr;  // [rows, heads] s_q
  int64_t ld_q_fp8 = 0;
};

// The positions of the k largest logits[r, t], t < seq_lens[r]. Ties go to the lower t; if
// seq_len <= k every t < seq_len is taken. Output is in ascending position order, -1 filled.
// If out_slots is set, positions are also mapped through the page table to physical slots.
struct TopkParams {
  const float* logits = nullptr;        // [rows, ld_logits]
  const int32_t* seq_lens = nullptr;    // [rows]
  int32_t* out_positions = nullptr;     // [rows, k] token positions, -1 = unused
  int64_t* out_slots = nullptr;         // [rows, k] physical slots, -1 = unused (optional)
  const int32_t* page_table = nullptr;  // [rows, ld_page_table] (needed for out_slots)
  int rows = 0, k = 0;
  int64_t ld_logits = 0, ld_page_table = 0;
};

// Absorbed sparse MLA decode over the selected slots. For each row r and head h:
//   s_j = scale * (q_lat . c_j + q_rope . k_rope_j) over valid selected slots j,
//   p = softmax(s), out[r, h, :] = sum_j p_j * c_j.
// q is rounded to bf16; c and k_rope are the cache's values (fp8 dequantized by its tile scale).
// A slot < 0 or >= capacity is unused. A row with no used slot gets exactly 0 (and lse = -inf).
struct SparseMlaParams {
  const float* q = nullptr;  // [rows, heads, 576] q_lat(512) ‖ q_rope(64), row stride ld_q
  const int64_t* indices = nullptr;  // [rows, topk] physical slots, row stride ld_indices
  float* out = nullptr;              // [rows, heads, 512], row stride ld_out
  float* lse = nullptr;              // [rows, heads] log-sum-exp of scores (optional)
  PoolView pool;                     // latent layout
  int rows = 0, heads = 0, topk = 0;
  int64_t ld_q = 0, ld_indices = 0, ld_out = 0;
  float scale = 0.0f;
  // Diagnostics, CUDA only: when set, the warp-specialized kernel (DSA_CUDA_SPARSE_MLA_VARIANT=ws)
  // writes SparseMlaTrace::kWords words per CTA, in blockIdx order; every other kernel and
  // backend ignores it.
  uint64_t* trace = nullptr;
};
// The words of one CTA's SparseMlaParams::trace. clock64 at: the CTA's start; warpgroup 0's share
// of q stored into the cluster; the prologue's end (q complete in every CTA); warpgroup 0's first
// S (chunk 0 landed); warpgroup 0's and warpgroup 1's token-loop ends; the cluster's partials
// complete (after the cluster barrier); this CTA's slice combined; the CTA's end. Then globaltimer
// (ns) at the start and the end, and the SM id | n_chunks << 32.
struct SparseMlaTrace {
  enum Word : int {
    kStart,
    kQStored,
    kPrologue,
    kFirstS,
    kLoop0,
    kLoop1,
    kParts,
    kCombined,
    kEnd,
    kNsStart,
    kNsEnd,
    kWhere,
    kWords
  };
};

// ---- Sampling ---------------------------------------------------------------------------------

// One token per row from its logits: greedy (temperature <= 0) or temperature + top-p with the
// row's seeded stream, by the arithmetic of dsa/sampling.h, so every backend draws the same token.
// A row's draw depends only on its own logits and parameters (batch-invariant).
struct SampleParams {
  const float* logits = nullptr;       // [rows, vocab], row stride ld_logits
  const float* temperature = nullptr;  // [rows]; <= 0: greedy
  const float* top_p = nullptr;        // [rows] in (0, 1]
  const uint64_t* seed = nullptr;      // [rows] the request's random stream
  const uint64_t* index = nullptr;     // [rows] the draw's position in the request's output
  int32_t* tokens = nullptr;           // [rows] out; -1 when every logit of the row is NaN
  float* logprobs = nullptr;           // [rows] out, optional: log softmax(logits)[token] at T = 1
  void* workspace = nullptr;           // Backend::sample_workspace_bytes(rows, vocab) bytes
  int rows = 0, vocab = 0;             // vocab <= kMaxSampleVocab
  int64_t ld_logits = 0;
};

// ---- The slot-integrity auditor (DESIGN §6) ---------------------------------------------------

// digests[i] = slot_digest of slots[i] in `pool` (src/cache/slot_digest.h). When `expected` is
// set, also flags[i] = (digests[i] != expected[i]) and *mismatches += the number of flagged slots,
// so the compare happens where the cache lives.
struct AuditSlotsParams {
  const int64_t* slots = nullptr;      // [n] valid slots (>= 64, < capacity)
  uint64_t* digests = nullptr;         // [n] out
  const uint64_t* expected = nullptr;  // [n] or null
  uint8_t* flags = nullptr;            // [n] out, when expected is set
  int32_t* mismatches = nullptr;       // [1] += flagged count, when expected is set
  PoolView pool;
  PoolKind kind = PoolKind::kLatent;
  int n = 0;
};

// One watched pool of a sampled audit: its bytes and the expected digest of every watched
// position (the slot at live[position]).
struct AuditPool {
  PoolView view;
  PoolKind kind = PoolKind::kLatent;
  int32_t layer = 0;                   // the caller's label, for findings
  const uint64_t* expected = nullptr;  // [capacity] by position
};

// The first mismatches a sampled audit keeps (every one is counted).
inline constexpr int kSampledMismatchesKept = 32;

struct SampledMismatch {
  int64_t slot = 0;
  int64_t step = 0;  // the step of the audit that found it
  int32_t pool = 0;  // index into AuditSampleParams::pools
  int32_t unused = 0;
};

// The device-side record of sampled audits. `next_step` and `done_blocks` belong to the op; a
// reader copies the rest (from `verifies` on) and may zero it, in stream order, to start afresh.
struct AuditSampleRecord {
  int64_t next_step = 0;     // the step of the next audit not given one
  uint32_t done_blocks = 0;  // of the running launch (the last block out advances next_step)
  uint32_t unused = 0;
  uint64_t verifies = 0;    // audits completed
  uint64_t mismatches = 0;  // mismatching (pool, slot) checks counted
  uint32_t kept = 0;  // claims on `first`; min(kept, kSampledMismatchesKept) entries are filled
  uint32_t unused2 = 0;
  SampledMismatch first[kSampledMismatchesKept];
};

// The always-on sampled audit: one launch for every pool, nothing read back, capturable. Draws
// `sample` positions of the watched set [0, *live_count) by the auditor's rule
// (audit_sample_position in slot_digest.h: one per stratum, from (seed, step)), or takes every
// position when sample >= *live_count; recomputes each pool's digest of the slot there, compares
// it with the pool's expected digest and counts mismatches into `findings`, keeping the first
// kSampledMismatchesKept. The step is `step` when >= 0, else findings->next_step; either way
// next_step is step + 1 after the launch, so a launch replayed from a graph draws anew each time.
struct AuditSampleParams {
  const int64_t* live = nullptr;          // [*live_count] watched slots (>= 64, < capacity)
  const int64_t* live_count = nullptr;    // [1]
  const AuditPool* pools = nullptr;       // [n_pools], in the backend's memory
  AuditSampleRecord* findings = nullptr;  // [1]
  int64_t* drawn = nullptr;  // [sample] out, optional: positions drawn, -1 past the set
  int n_pools = 0;
  int sample = 0;
  uint64_t seed = 0;
  int64_t step = -1;
};

}  // namespace dsa
