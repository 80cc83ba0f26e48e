// Batched GEMM with bf16 weights: the executable spec.
//
//   y_b[m, n] = alpha * acc            (kOverwrite)
//   y_b[m, n] = y_b[m, n] + alpha * acc (kAccumulate)
//   acc = ((x[m,0]*w(n,0) + x[m,1]*w(n,1)) + ...) + x[m,k-1]*w(n,k-1)
// in f32: each product is rounded to f32, then added to an f32 accumulator that starts at +0, in
// ascending k. x is used as f32 as it is; w is widened from bf16 exactly. Products are not fused
// into FMAs (the build is ISO C++, so the compiler does not contract them).
//
// fp8 weights (w_fp8, kNK only): w(n, k) = dequant_fp8_weight(w_fp8[n, k], w_scale[n / 128][k /
// 128]) (ops.h, dsa/dtype.h), widened from that bf16 exactly as a bf16 weight is; nothing else
// changes, so the result is this GEMM's on the dequantized bf16 matrix, bit for bit.
//
// fp8 activations (x_fp8, with w_fp8; ops.h): each x row is encoded per 128-wide k block by
// encode_fp8_group (codes q_x, scale s_x), and per output
//   acc = 0; for kb ascending: P = ((q_x[kb0] * q_w[kb0] + q_x[kb0+1] * q_w[kb0+1]) + ...);
//                              acc = acc + P * (s_x[kb] * s_w[kb])
// with the codes widened to f32 exactly (every product of two e4m3 values is exact in f32).
//
// Every output element follows that sequence exactly, whatever the tiling below, so a row's bits
// do not depend on m, on the other rows, or on where the row sits in the batch. The tiling only
// keeps the loops cache-friendly and gives the compiler independent accumulators to vectorize:
//   kNK: a tile of kTileN weight rows is widened to f32 and transposed to [k, kTileN], then every
//        x row accumulates kTileN outputs at once, one k at a time.
//   kKN: a chunk of a weight row (contiguous in n) is widened once per k and added, scaled by
//        x[m, k], into kTileM accumulator rows.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dsa/backend.h"
#include "dsa/error.h"
#include "dsa/token_codec.h"

namespace dsa::cpu {
namespace {

constexpr int kTileN = 16;    // kNK: outputs accumulated together per x row
constexpr int kTileM = 4;     // kKN: x rows sharing one widened weight row
constexpr int kChunkN = 512;  // kKN: outputs per accumulator row (4 x 512 f32 = 8 KiB)

void check_params(const GemmParams& p) {
  require(p.m >= 0 && p.n > 0 && p.k > 0 && p.batch >= 0, ErrorCode::kInvalidArgument,
          "gemm: m {} and batch {} must be >= 0, n {} and k {} > 0", p.m, p.batch, p.n, p.k);
  const int64_t w_row = p.layout == WeightLayout::kNK ? p.k : p.n;
  require(p.ld_x >= p.k && p.ld_y >= p.n && p.ld_w >= w_row, ErrorCode::kInvalidArgument,
          "gemm: row strides ld_x {} (k {}), ld_w {} ({}), ld_y {} (n {}) are too short", p.ld_x,
          p.k, p.ld_w, w_row, p.ld_y, p.n);
  if (p.m == 0 || p.batch == 0) return;
  require(p.x && p.y, ErrorCode::kInvalidArgument, "gemm: x and y must be set");
  require_gemm_weight_operand(p);
}

// Writes count accumulated sums to y, per the output mode.
void store(const float* acc, int count, float alpha, GemmOutput output, float* y) {
  if (output == GemmOutput::kOverwrite) {
    for (int j = 0; j < count; ++j) y[j] = alpha * acc[j];
  } else {
    for (int j = 0; j < count; ++j) y[j] = y[j] + alpha * acc[j];
  }
}

// Weight row n of a kNK matrix, widened to f32 into dst[kk * stride] for kk in [0, k): from bf16
// (w), or dequantized from fp8 by its row of block scales (p.w_fp8, batch 1).
void widen_weight_row(const GemmParams& p, const Bf16* w, int n, float* dst, int stride) {
  if (p.w_fp8) {
    const uint8_t* q = p.w_fp8 + int64_t(n) * p.ld_w;
    const float* scales = p.w_scale + int64_t(n / kGemmFp8Block) * p.ld_w_scale;
    for (int kk = 0; kk < p.k; ++kk) {
      const Bf16 v = dequant_fp8_weight(Fp8E4M3{q[kk]}, scales[kk / kGemmFp8Block]);
      dst[size_t(kk) * stride] = bf16_to_float(v);
    }
    return;
  }
  const Bf16* w_row = w + int64_t(n) * p.ld_w;
  for (int kk = 0; kk < p.k; ++kk) dst[size_t(kk) * stride] = bf16_to_float(w_row[kk]);
}

// One batch entry, w[n, k] (bf16 w, or p.w_fp8 when w is null).
void gemm_nk(const GemmParams& p, const float* x, const Bf16* w, float* y) {
  std::vector<float> tile(size_t(p.k) * kTileN);  // [k, kTileN]: w rows n0.. as columns
  for (int n0 = 0; n0 < p.n; n0 += kTileN) {
    const int width = std::min(kTileN, p.n - n0);
    if (width < kTileN) std::fill(tile.begin(), tile.end(), 0.0f);  // spare lanes: never stored
    for (int j = 0; j < width; ++j) widen_weight_row(p, w, n0 + j, tile.data() + j, kTileN);
    for (int row = 0; row < p.m; ++row) {
      const float* x_row = x + row * p.ld_x;
      float acc[kTileN] = {};
      for (int kk = 0; kk < p.k; ++kk) {
        const float xv = x_row[kk];
        const float* t = tile.data() + size_t(kk) * kTileN;
        for (int j = 0; j < kTileN; ++j) acc[j] += xv * t[j];
      }
      store(acc, width, p.alpha, p.output, y + row * p.ld_y + n0);
    }
  }
}

// acc[0, lanes) += xv * w_wide[0, lanes), lanes a multiple of kTileN: the fixed-size inner loop
// vectorizes across outputs, and each output still gets exactly one add per k.
void add_scaled_row(float xv, const float* __restrict w_wide, float* __restrict acc, int lanes) {
  for (int j0 = 0; j0 < lanes; j0 += kTileN) {
    for (int j = 0; j < kTileN; ++j) acc[j0 + j] += xv * w_wide[j0 + j];
  }
}

// One batch entry, w[k, n].
void gemm_kn(const GemmParams& p, const float* x, const Bf16* w, float* y) {
  static_assert(kChunkN % kTileN == 0);
  std::vector<float> acc(size_t(kTileM) * kChunkN);  // [kTileM, kChunkN]
  std::vector<float> w_wide(kChunkN);                // one weight row chunk, widened
  for (int n0 = 0; n0 < p.n; n0 += kChunkN) {
    const int width = std::min(kChunkN, p.n - n0);
    const int lanes = (width + kTileN - 1) / kTileN * kTileN;
    std::fill(w_wide.begin() + width, w_wide.begin() + lanes, 0.0f);  // spare lanes: never stored
    for (int m0 = 0; m0 < p.m; m0 += kTileM) {
      const int height = std::min(kTileM, p.m - m0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int kk = 0; kk < p.k; ++kk) {
        const Bf16* w_row = w + kk * p.ld_w + n0;
        for (int j = 0; j < width; ++j) w_wide[j] = bf16_to_float(w_row[j]);
        for (int i = 0; i < height; ++i) {
          add_scaled_row(x[(m0 + i) * p.ld_x + kk], w_wide.data(), acc.data() + size_t(i) * kChunkN,
                         lanes);
        }
      }
      for (int i = 0; i < height; ++i) {
        store(acc.data() + size_t(i) * kChunkN, width, p.alpha, p.output,
              y + (m0 + i) * p.ld_y + n0);
      }
    }
  }
}

// fp8 activations: one batch entry (batch 1), w[n, k] as fp8 codes with block scales; x's codes
// and scales from p.x8 when given, else encoded here (the same encoder: the same values).
void gemm_nk_w8a8(const GemmParams& p, const float* x, float* y) {
  const int blocks = (p.k + kGemmFp8Block - 1) / kGemmFp8Block;
  std::vector<uint8_t> own_codes;
  std::vector<float> own_scales;
  Fp8Rows x8 = p.x8;
  if (!x8.codes) {
    own_codes.resize(size_t(p.m) * p.k);
    own_scales.resize(size_t(blocks) * p.m);
    x8 = {own_codes.data(), own_scales.data(), p.k, p.m};
    for (int row = 0; row < p.m; ++row) encode_fp8_rows(x + row * p.ld_x, p.k, row, x8);
  }
  std::vector<float> xq(size_t(p.m) * p.k), sx(size_t(p.m) * blocks);
  for (int row = 0; row < p.m; ++row) {
    for (int kk = 0; kk < p.k; ++kk) {
      xq[size_t(row) * p.k + kk] = fp8_to_float(Fp8E4M3{x8.codes[row * x8.ld + kk]});
    }
    for (int kb = 0; kb < blocks; ++kb) {
      sx[size_t(row) * blocks + kb] = x8.scales[kb * x8.ld_scales + row];
    }
  }
  std::vector<float> wq(size_t(p.k));
  for (int n = 0; n < p.n; ++n) {
    const uint8_t* q = p.w_fp8 + int64_t(n) * p.ld_w;
    const float* scales = p.w_scale + int64_t(n / kGemmFp8Block) * p.ld_w_scale;
    for (int kk = 0; kk < p.k; ++kk) wq[size_t(kk)] = fp8_to_float(Fp8E4M3{q[kk]});
    for (int row = 0; row < p.m; ++row) {
      const float* xr = xq.data() + size_t(row) * p.k;
      float acc = 0.0f;
      for (int kb = 0; kb < blocks; ++kb) {
        const int k0 = kb * kGemmFp8Block, k1 = std::min(p.k, k0 + kGemmFp8Block);
        float part = 0.0f;
        for (int kk = k0; kk < k1; ++kk) part += xr[kk] * wq[size_t(kk)];
        acc = acc + part * (sx[size_t(row) * blocks + kb] * scales[kb]);
      }
      store(&acc, 1, p.alpha, p.output, y + row * p.ld_y + n);
    }
  }
}

}  // namespace

void encode_fp8_rows(const float* row, int cols, int64_t r, const Fp8Rows& out) {
  for (int b = 0; b * kFp8BlockCols < cols; ++b) {
    const int c0 = b * kFp8BlockCols, len = std::min(kFp8BlockCols, cols - c0);
    out.scales[b * out.ld_scales + r] =
        encode_fp8_group(row + c0, len, reinterpret_cast<Fp8E4M3*>(out.codes + r * out.ld + c0),
                         ScaleRounding::kExact);
  }
}

void gemm(const GemmParams& p) {
  check_params(p);
  if (p.m == 0) return;
  for (int b = 0; b < p.batch; ++b) {
    const float* x = p.x + b * p.batch_stride_x;
    const Bf16* w = p.w ? p.w + b * p.batch_stride_w : nullptr;  // null: p.w_fp8 (batch 1)
    float* y = p.y + b * p.batch_stride_y;
    if (p.x_fp8) {
      gemm_nk_w8a8(p, x, y);
    } else if (p.layout == WeightLayout::kNK) {
      gemm_nk(p, x, w, y);
    } else {
      gemm_kn(p, x, w, y);
    }
  }
}

}  // namespace dsa::cpu
