// Elementwise and row-wise ops: SwiGLU, softmax, embedding lookup, residual add. The executable
// spec: f32 throughout, rows independent, row sums in ascending column order.
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "dsa/backend.h"
#include "dsa/error.h"

namespace dsa::cpu {

void swiglu(const SwigluParams& p) {
  require(p.rows >= 0 && p.inter > 0, ErrorCode::kInvalidArgument,
          "swiglu: rows {} must be >= 0 and inter {} > 0", p.rows, p.inter);
  require(p.ld_in >= 2 * int64_t(p.inter) && p.ld_out >= p.inter, ErrorCode::kInvalidArgument,
          "swiglu: row strides ld_in {} must be >= 2*inter {} and ld_out {} >= inter", p.ld_in,
          2 * int64_t(p.inter), p.ld_out);
  require(p.rows == 0 || (p.gate_up && p.out), ErrorCode::kInvalidArgument,
          "swiglu: gate_up and out must be set");
  if (p.out_fp8.codes) require_fp8_rows("swiglu", p.out_fp8, p.rows, p.inter);
  for (int r = 0; r < p.rows; ++r) {
    const float* gate = p.gate_up + r * p.ld_in;
    const float* up = gate + p.inter;
    float* out = p.out + r * p.ld_out;
    // silu(g) = g / (1 + exp(-g)); a very negative g gives exp = inf and a signed zero, not NaN.
    for (int i = 0; i < p.inter; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    if (p.out_fp8.codes) encode_fp8_rows(out, p.inter, r, p.out_fp8);
  }
}

// exp(x - max) / sum, with the sum in ascending order. A row whose max is -inf (every entry -inf)
// has no defined distribution and becomes all zeros rather than NaN.
void softmax(const SoftmaxParams& p) {
  require(p.rows >= 0 && p.cols >= 0 && p.ld >= p.cols, ErrorCode::kInvalidArgument,
          "softmax: rows {} and cols {} must be >= 0, row stride {} >= cols", p.rows, p.cols, p.ld);
  require(p.rows == 0 || p.cols == 0 || p.x, ErrorCode::kInvalidArgument, "softmax: x must be set");
  for (int r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.ld;
    float max = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < p.cols; ++i) max = x[i] > max ? x[i] : max;
    if (max == -std::numeric_limits<float>::infinity()) {
      for (int i = 0; i < p.cols; ++i) x[i] = 0.0f;
      continue;
    }
    float sum = 0.0f;
    for (int i = 0; i < p.cols; ++i) {
      x[i] = std::exp(x[i] - max);
      sum += x[i];
    }
    for (int i = 0; i < p.cols; ++i) x[i] /= sum;
  }
}

void embed(const EmbedParams& p) {
  require(p.rows >= 0 && p.vocab >= 0 && p.dim > 0 && p.ld_out >= p.dim,
          ErrorCode::kInvalidArgument,
          "embed: rows {} and vocab {} must be >= 0, dim {} > 0, row stride {} >= dim", p.rows,
          p.vocab, p.dim, p.ld_out);
  require(p.rows == 0 || (p.tokens && p.out && (p.table || p.vocab == 0)),
          ErrorCode::kInvalidArgument, "embed: tokens, table and out must be set");
  for (int r = 0; r < p.rows; ++r) {
    const int32_t token = p.tokens[r];
    float* out = p.out + r * p.ld_out;
    if (token < 0 || token >= p.vocab) {
      for (int i = 0; i < p.dim; ++i) out[i] = 0.0f;
      continue;
    }
    const Bf16* row = p.table + int64_t(token) * p.dim;
    for (int i = 0; i < p.dim; ++i) out[i] = bf16_to_float(row[i]);
  }
}

void add(const AddParams& p) {
  require(p.rows >= 0 && p.dim > 0 && p.ld_x >= p.dim && p.ld_y >= p.dim,
          ErrorCode::kInvalidArgument,
          "add: rows {} must be >= 0, dim {} > 0, row strides ld_x {} and ld_y {} >= dim", p.rows,
          p.dim, p.ld_x, p.ld_y);
  require(p.rows == 0 || (p.x && p.y), ErrorCode::kInvalidArgument, "add: x and y must be set");
  for (int r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.ld_x;
    float* y = p.y + r * p.ld_y;
    for (int i = 0; i < p.dim; ++i) y[i] += x[i];
  }
}

}  // namespace dsa::cpu
