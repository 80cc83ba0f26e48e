// The model's one way to call a projection: y[rows, n] (+)= alpha * x[rows, k] * w[n, k]^T, with
// w bf16 or fp8 with 128 x 128 block scales (WeightMatrix, GemmParams::w_fp8).
#pragma once

#include "dsa/backend.h"
#include "dsa/model.h"

namespace dsa {

// x_bf16, when set, is bf16(x) with row stride k (written by the norm that produced x), which the
// fast GEMM mode reads instead of converting x again; x8, when set, is x's fp8 rows (its producer
// wrote them), read instead of quantizing x again when w takes fp8 activations.
inline void linear(Backend& be, const float* x, int64_t ld_x, const WeightMatrix& w, int n, int k,
                   float* y, int64_t ld_y, int rows, GemmOutput output = GemmOutput::kOverwrite,
                   float alpha = 1, const Bf16* x_bf16 = nullptr, const Fp8Rows& x8 = {}) {
  GemmParams g;
  g.x = x;
  g.w = w.bf16;
  g.w_fp8 = w.fp8;
  g.w_scale = w.scale;
  g.ld_w_scale = (int64_t(k) + kGemmFp8Block - 1) / kGemmFp8Block;
  g.x_fp8 = w.fp8 != nullptr && w.x_fp8;
  g.y = y;
  g.m = rows;
  g.n = n;
  g.k = k;
  g.ld_x = ld_x;
  g.ld_w = k;
  g.ld_y = ld_y;
  g.output = output;
  g.alpha = alpha;
  g.x_bf16 = x_bf16;
  g.ld_x_bf16 = k;
  if (g.x_fp8) g.x8 = x8;
  g.w_constant = true;  // the model's weights: written once, at load
  be.gemm(g);
}

inline void linear(Backend& be, const float* x, int64_t ld_x, const Bf16* w, int n, int k, float* y,
                   int64_t ld_y, int rows, GemmOutput output = GemmOutput::kOverwrite,
                   float alpha = 1, const Bf16* x_bf16 = nullptr) {
  linear(be, x, ld_x, WeightMatrix{w}, n, k, y, ld_y, rows, output, alpha, x_bf16);
}

}  // namespace dsa
