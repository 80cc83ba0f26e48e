// The indexer's logits over a paged index-K cache (DESIGN §1.5): the executable spec.
//
//   bf16 cache: logit[t] = sum_h w[h] * relu(bf16(q[h]) . k[t])
//   fp8 cache:  logit[t] = k_scale[t] * sum_h (w[h] * s_q[h]) * relu(q8[h] . k8[t])
//
// Every sum runs in f32 in a fixed order (dims ascending, then heads ascending), so a row's
// logits depend only on that row's inputs and the cache: the op is batch-invariant.
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"
#include "dsa/token_codec.h"

namespace dsa::cpu {
namespace {

// One row's query, prepared once and reused for every token: the values the dot products see and
// the weight each head's relu(dot) is multiplied by.
struct PreparedQuery {
  std::vector<float> values;  // [heads, 128]: bf16-rounded q, or the e4m3 values of q / s_q
  std::vector<float> weight;  // [heads]: w_scale w, or (w_scale w) * s_q for fp8
};

void prepare_query(const IndexerLogitsParams& p, int row, PreparedQuery& out) {
  const float* q = p.q + int64_t(row) * p.ld_q;
  const float* w = p.w + int64_t(row) * p.ld_w;
  out.values.resize(size_t(p.heads) * kIndexHeadDim);
  out.weight.resize(size_t(p.heads));
  std::vector<Fp8E4M3> q8(kIndexHeadDim);
  for (int h = 0; h < p.heads; ++h) {
    const float* qh = q + int64_t(h) * kIndexHeadDim;
    float* vh = out.values.data() + int64_t(h) * kIndexHeadDim;
    if (p.pool.dtype == KvDtype::kBf16) {
      for (int d = 0; d < kIndexHeadDim; ++d) vh[d] = round_bf16(qh[d]);
      out.weight[h] = p.w_scale * w[h];
    } else {
      // Per (row, head) quantization with an exact scale: the same group encoder the cache uses.
      const float s_q = encode_fp8_group(qh, kIndexHeadDim, q8.data(), ScaleRounding::kExact);
      for (int d = 0; d < kIndexHeadDim; ++d) vh[d] = fp8_to_float(q8[d]);
      out.weight[h] = (p.w_scale * w[h]) * s_q;
    }
  }
}

// sum_h weight[h] * relu(values[h] . key), f32, dims then heads ascending.
float weighted_relu_sum(const PreparedQuery& q, int heads, const float* key) {
  float logit = 0.0f;
  for (int h = 0; h < heads; ++h) {
    const float* qh = q.values.data() + int64_t(h) * kIndexHeadDim;
    float dot = 0.0f;
    for (int d = 0; d < kIndexHeadDim; ++d) dot += qh[d] * key[d];
    const float relu = dot > 0.0f ? dot : 0.0f;  // NaN -> 0, as fmaxf(dot, 0) does
    logit += q.weight[h] * relu;
  }
  return logit;
}

void check_params(const IndexerLogitsParams& p) {
  require(p.rows >= 0 && p.heads > 0, ErrorCode::kInvalidArgument,
          "indexer_logits: rows {} must be >= 0 and heads {} > 0", p.rows, p.heads);
  require(p.ld_q >= int64_t(p.heads) * kIndexHeadDim && p.ld_w >= p.heads,
          ErrorCode::kInvalidArgument,
          "indexer_logits: ld_q {} must be >= heads * 128 = {} and ld_w {} >= heads {}", p.ld_q,
          int64_t(p.heads) * kIndexHeadDim, p.ld_w, p.heads);
}

// A page id the row may read: inside the pool. A bad one is never read (see IndexerLogitsParams).
bool readable_page(const IndexerLogitsParams& p, int32_t page) {
  return page >= 0 && page < p.pool.num_pages;
}

}  // namespace

void encode_index_query(const IndexerQueryParams& p) {
  require(p.q_fp8_scale != nullptr && p.ld_q_fp8 >= int64_t(p.heads) * kIndexHeadDim,
          ErrorCode::kInvalidArgument,
          "indexer_query: q_fp8 needs q_fp8_scale and ld_q_fp8 {} >= heads * 128 = {}", p.ld_q_fp8,
          int64_t(p.heads) * kIndexHeadDim);
  for (int r = 0; r < p.rows; ++r) {
    for (int h = 0; h < p.heads; ++h) {
      // prepare_query's encoder for an fp8 cache, so indexer_logits sees the same bytes either way.
      auto* out = reinterpret_cast<Fp8E4M3*>(p.q_fp8 + int64_t(r) * p.ld_q_fp8 +
                                             int64_t(h) * kIndexHeadDim);
      p.q_fp8_scale[int64_t(r) * p.heads + h] =
          encode_fp8_group(p.q + int64_t(r) * p.ld_q + int64_t(h) * kIndexHeadDim, kIndexHeadDim,
                           out, ScaleRounding::kExact);
    }
  }
}

void indexer_logits(const IndexerLogitsParams& p) {
  check_params(p);
  PreparedQuery query;
  std::vector<float> key(kIndexHeadDim);
  for (int r = 0; r < p.rows; ++r) {
    const int64_t seq_len = p.seq_lens[r];
    if (seq_len <= 0) continue;  // a padded row writes nothing
    require(seq_len <= p.ld_logits && seq_len <= p.ld_page_table * kPageSize,
            ErrorCode::kOutOfRange,
            "indexer_logits: row {} has seq_len {}, ld_logits is {} and its page table holds {}", r,
            seq_len, p.ld_logits, p.ld_page_table * kPageSize);
    prepare_query(p, r, query);
    const int32_t* pages = p.page_table + int64_t(r) * p.ld_page_table;
    float* logits = p.logits + int64_t(r) * p.ld_logits;
    for (int64_t t = 0; t < seq_len; ++t) {
      const int32_t page = pages[t / kPageSize];
      if (!readable_page(p, page)) {
        if (t % kPageSize == 0 && p.error_count) ++*p.error_count;  // once per page
        logits[t] = 0.0f;
        continue;
      }
      const int64_t slot = int64_t(page) * kPageSize + t % kPageSize;
      const float k_scale = decode_index_k_token(p.pool, slot, key.data());
      const float sum = weighted_relu_sum(query, p.heads, key.data());
      logits[t] = p.pool.dtype == KvDtype::kBf16 ? sum : k_scale * sum;
    }
  }
}

}  // namespace dsa::cpu
