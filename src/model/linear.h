// The model's one way to call a projection: y[rows, n] (+)= alpha * x[rows, k] * w[n, k]^T.
#pragma once

#include "dsa/backend.h"

namespace dsa {

inline void linear(Backend& be, const float* x, int64_t ld_x, const Bf16* w, int n, int k, float* y,
                   int64_t ld_y, int rows, GemmOutput output = GemmOutput::kOverwrite,
                   float alpha = 1) {
  GemmParams g;
  g.x = x;
  g.w = w;
  g.y = y;
  g.m = rows;
  g.n = n;
  g.k = k;
  g.ld_x = ld_x;
  g.ld_w = k;
  g.ld_y = ld_y;
  g.output = output;
  g.alpha = alpha;
  be.gemm(g);
}

}  // namespace dsa
