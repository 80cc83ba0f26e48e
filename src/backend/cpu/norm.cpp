// RMSNorm and LayerNorm: the executable spec.
//
// Every statistic is an f32 sum in ascending column order, and each row is normalized on its own,
// so a row's bits never depend on the other rows of the batch. Statistics are computed before any
// element is written, which is what lets y alias x.
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "dsa/backend.h"
#include "dsa/error.h"

namespace dsa::cpu {
namespace {

void check_rows(const char* op, const void* x, const void* y, const void* weight, int rows, int dim,
                int64_t ld_x, int64_t ld_y) {
  require(rows >= 0 && dim > 0, ErrorCode::kInvalidArgument,
          "{}: rows {} must be >= 0 and dim {} > 0", op, rows, dim);
  require(ld_x >= dim && ld_y >= dim, ErrorCode::kInvalidArgument,
          "{}: row strides ld_x {} and ld_y {} must be >= dim {}", op, ld_x, ld_y, dim);
  require(rows == 0 || (x && y && weight), ErrorCode::kInvalidArgument,
          "{}: x, y and weight must be set", op);
}

// sum(x[i]^2) / dim over one row, in f32, ascending i.
float mean_square(const float* x, int dim) {
  float sum = 0.0f;
  for (int i = 0; i < dim; ++i) sum += x[i] * x[i];
  return sum / float(dim);
}

// mean and biased variance of one row; two passes, so a large mean does not cancel the variance.
void mean_variance(const float* x, int dim, float& mean, float& variance) {
  float sum = 0.0f;
  for (int i = 0; i < dim; ++i) sum += x[i];
  mean = sum / float(dim);
  float sq = 0.0f;
  for (int i = 0; i < dim; ++i) {
    const float d = x[i] - mean;
    sq += d * d;
  }
  variance = sq / float(dim);
}

}  // namespace

void rmsnorm(const RmsNormParams& p) {
  check_rows("rmsnorm", p.x, p.y, p.weight, p.rows, p.dim, p.ld_x, p.ld_y);
  require(!p.y_bf16 || p.ld_y_bf16 >= p.dim, ErrorCode::kInvalidArgument,
          "rmsnorm: ld_y_bf16 {} must be >= dim {}", p.ld_y_bf16, p.dim);
  if (p.y_fp8.codes) require_fp8_rows("rmsnorm", p.y_fp8, p.rows, p.dim);
  for (int r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.ld_x;
    float* y = p.y + r * p.ld_y;
    const float inv_rms = 1.0f / std::sqrt(mean_square(x, p.dim) + p.eps);
    for (int i = 0; i < p.dim; ++i) y[i] = (x[i] * inv_rms) * bf16_to_float(p.weight[i]);
    if (p.y_fp8.codes) encode_fp8_rows(y, p.dim, r, p.y_fp8);
    if (!p.y_bf16) continue;
    Bf16* yb = p.y_bf16 + r * p.ld_y_bf16;
    for (int i = 0; i < p.dim; ++i) yb[i] = float_to_bf16(y[i]);
  }
}

void layernorm(const LayerNormParams& p) {
  check_rows("layernorm", p.x, p.y, p.weight, p.rows, p.dim, p.ld_x, p.ld_y);
  for (int r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.ld_x;
    float* y = p.y + r * p.ld_y;
    float mean = 0.0f, variance = 0.0f;
    mean_variance(x, p.dim, mean, variance);
    const float inv_std = 1.0f / std::sqrt(variance + p.eps);
    for (int i = 0; i < p.dim; ++i) {
      const float normed = ((x[i] - mean) * inv_std) * bf16_to_float(p.weight[i]);
      y[i] = p.bias ? normed + bf16_to_float(p.bias[i]) : normed;
    }
  }
}

}  // namespace dsa::cpu
