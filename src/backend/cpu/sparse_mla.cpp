// Absorbed sparse MLA decode over the selected slots (DESIGN §1.7): the executable spec.
//
// For row r, head h and every valid selected slot j (0 <= slot < capacity; -1 and out-of-range
// entries are skipped), in ascending j:
//   s_j = scale * (q_lat . c_j + q_rope . k_rope_j)      q rounded to bf16, f32 dots
//   m = max_j s_j,  e_j = exp(s_j - m),  sum = sum_j e_j   (max subtraction: no overflow)
//   out[d] = (sum_j e_j * c_j[d]) / sum,  lse = m + log(sum)
// A row with no valid slot gets out = 0.0f exactly and lse = -inf, never NaN.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"
#include "dsa/token_codec.h"

namespace dsa::cpu {
namespace {

// The decoded tokens a row attends to, in the order of its index list: [n, 576] c ‖ k_rope.
int gather_tokens(const SparseMlaParams& p, int row, std::vector<float>& tokens) {
  const int64_t* indices = p.indices + int64_t(row) * p.ld_indices;
  const int64_t capacity = p.pool.capacity();
  tokens.resize(size_t(p.topk) * kLatentDim);
  int n = 0;
  for (int j = 0; j < p.topk; ++j) {
    const int64_t slot = indices[j];
    if (slot < 0 || slot >= capacity) continue;
    decode_latent_token(p.pool, slot, tokens.data() + int64_t(n) * kLatentDim);
    ++n;
  }
  return n;
}

// One head: q [576] (already bf16-rounded) against n tokens; writes out [512] and lse.
void attend_head(const float* q, const float* tokens, int n, float scale,
                 std::vector<float>& scores, float* out, float* lse) {
  scores.resize(size_t(n));
  float max_score = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) {
    const float* c = tokens + int64_t(j) * kLatentDim;
    float dot_latent = 0.0f, dot_rope = 0.0f;
    for (int d = 0; d < kKvLoraRank; ++d) dot_latent += q[d] * c[d];
    for (int d = kKvLoraRank; d < kLatentDim; ++d) dot_rope += q[d] * c[d];
    scores[size_t(j)] = scale * (dot_latent + dot_rope);
    max_score = std::max(max_score, scores[size_t(j)]);
  }
  std::fill(out, out + kKvLoraRank, 0.0f);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float e = std::exp(scores[size_t(j)] - max_score);
    sum += e;
    const float* c = tokens + int64_t(j) * kLatentDim;
    for (int d = 0; d < kKvLoraRank; ++d) out[d] += e * c[d];
  }
  for (int d = 0; d < kKvLoraRank; ++d) out[d] /= sum;
  if (lse != nullptr) *lse = max_score + std::log(sum);
}

void check_params(const SparseMlaParams& p) {
  require(p.rows >= 0 && p.heads > 0 && p.topk >= 0, ErrorCode::kInvalidArgument,
          "sparse_mla: rows {} and topk {} must be >= 0, heads {} > 0", p.rows, p.topk, p.heads);
  require(p.ld_q >= int64_t(p.heads) * kLatentDim && p.ld_out >= int64_t(p.heads) * kKvLoraRank,
          ErrorCode::kInvalidArgument,
          "sparse_mla: ld_q {} must be >= heads * 576 = {} and ld_out {} >= heads * 512 = {}",
          p.ld_q, int64_t(p.heads) * kLatentDim, p.ld_out, int64_t(p.heads) * kKvLoraRank);
}

}  // namespace

void sparse_mla(const SparseMlaParams& p) {
  check_params(p);
  std::vector<float> tokens, scores, q(kLatentDim);
  for (int r = 0; r < p.rows; ++r) {
    const int n = gather_tokens(p, r, tokens);
    for (int h = 0; h < p.heads; ++h) {
      float* out = p.out + int64_t(r) * p.ld_out + int64_t(h) * kKvLoraRank;
      float* lse = p.lse == nullptr ? nullptr : p.lse + int64_t(r) * p.heads + h;
      if (n == 0) {  // nothing selected: exactly zero, and no 0/0
        std::fill(out, out + kKvLoraRank, 0.0f);
        if (lse != nullptr) *lse = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float* q_in = p.q + int64_t(r) * p.ld_q + int64_t(h) * kLatentDim;
      for (int d = 0; d < kLatentDim; ++d) q[size_t(d)] = round_bf16(q_in[d]);
      attend_head(q.data(), tokens.data(), n, p.scale, scores, out, lse);
    }
  }
}

}  // namespace dsa::cpu
