// RMSNorm and LayerNorm. The statistics follow the fixed order of norm.cuh (one warp per row up to
// kWarpRowMaxDim columns, else a 256-thread group): batch-invariant. The CPU reference sums in
// ascending column order; the tree differs by rounding only (nmse ~1e-13).
//
// Launch shapes:
//   short rows (dim <= 1024): a warp per row, 4 rows per 128-thread CTA;
//   long rows: a 256-thread CTA per (row, part). Every CTA of a row computes the row's statistic
//   over the whole row (the same bits in each: the order does not depend on the part) and writes
//   only its part's columns, so a lone 7168-wide row is spread over 7 CTAs. Parts are used only
//   when y does not overlap x (another CTA could otherwise read a column already normalized).
// Loads and stores are 16 bytes (8 for the bf16 weight and copy) when every row is aligned, else
// element by element with the same arithmetic. In place (y == x) is allowed: a thread reads each
// column it writes before writing it, after the whole row was read for the statistic.
#include "backend/cuda/launch.h"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/pdl.h"
#include "backend/cuda/query_fp8.cuh"

namespace dsa::cuda {
namespace {

constexpr int kWarpRowsPerCta = 4;

// The weights of columns c0 .. c0 + 3 (those below dim).
__device__ __forceinline__ float4 weight4(const Bf16* w, int c0, int dim, bool vec) {
  if (vec) {
    const uint2 b = *reinterpret_cast<const uint2*>(w + c0);
    return make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xFFFF0000u),
                       __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xFFFF0000u));
  }
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (c0 < dim) v.x = bf16_to_float(w[c0]);
  if (c0 + 1 < dim) v.y = bf16_to_float(w[c0 + 1]);
  if (c0 + 2 < dim) v.z = bf16_to_float(w[c0 + 2]);
  if (c0 + 3 < dim) v.w = bf16_to_float(w[c0 + 3]);
  return v;
}

// The weights of this thread's first group g0 (zeros when it has none), loaded before the row's
// statistic so their latency overlaps the reduction's.
__device__ __forceinline__ float4 first_weights(const Bf16* w, int g0, int end, int dim, bool vec) {
  return g0 < end ? weight4(w, 4 * g0, dim, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ void store4(float* row, int c0, int dim, bool vec, float4 v) {
  if (vec) {
    *reinterpret_cast<float4*>(row + c0) = v;
    return;
  }
  if (c0 < dim) row[c0] = v.x;
  if (c0 + 1 < dim) row[c0 + 1] = v.y;
  if (c0 + 2 < dim) row[c0 + 2] = v.z;
  if (c0 + 3 < dim) row[c0 + 3] = v.w;
}

__device__ __forceinline__ void store4_bf16(Bf16* row, int c0, int dim, bool vec, float4 v) {
  if (vec) {
    *reinterpret_cast<uint2*>(row + c0) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    return;
  }
  if (c0 < dim) row[c0] = float_to_bf16(v.x);
  if (c0 + 1 < dim) row[c0 + 1] = float_to_bf16(v.y);
  if (c0 + 2 < dim) row[c0 + 2] = float_to_bf16(v.z);
  if (c0 + 3 < dim) row[c0 + 3] = float_to_bf16(v.w);
}

// Visits this thread's groups g0, g0 + threads, ... below `end` in batches of kWriteBatch: a
// batch's columns and weights are all loaded before any of its results is stored, so those loads
// are in flight together. (In place, y == x, the compiler must otherwise order each load after
// the previous group's store: one memory round trip per group.) A thread reads here only the
// columns it writes (in place there is a single part, so the groups are the statistic's own), so
// loading them early reads the same values: the bits do not change.
constexpr int kWriteBatch = 4;
template <typename Emit>
__device__ __forceinline__ void for_own_groups(const float* x, const Bf16* weight, float4 w0,
                                               int g0, int end, int threads, int dim, bool vec,
                                               Emit emit) {
  for (int g = g0; g < end; g += kWriteBatch * threads) {
    float4 v[kWriteBatch], w[kWriteBatch];
#pragma unroll
    for (int u = 0; u < kWriteBatch; ++u) {
      const int gu = g + u * threads;
      if (gu < end) {
        v[u] = norm_load4(x, 4 * gu, dim, vec);
        w[u] = gu == g0 ? w0 : weight4(weight, 4 * gu, dim, vec);
      }
    }
#pragma unroll
    for (int u = 0; u < kWriteBatch; ++u) {
      const int gu = g + u * threads;
      if (gu < end) emit(4 * gu, v[u], w[u]);
    }
  }
}

// Where this thread stands: its row, its index t in the row's group of `threads`, and the groups
// of 4 columns [begin, end) that its CTA writes. False for a warp past the last row.
struct RowSpot {
  int64_t row;
  int t, threads, begin, end;
};

template <bool kWarp>
__device__ __forceinline__ bool row_spot(int rows, int dim, RowSpot& s) {
  const int groups = (dim + 3) / 4;
  if constexpr (kWarp) {
    s.row = int64_t(blockIdx.x) * kWarpRowsPerCta + threadIdx.x / 32;
    s.t = threadIdx.x & 31;
    s.threads = 32;
    s.begin = 0;
    s.end = groups;
    return s.row < rows;
  } else {
    // Parts of whole 128-column blocks (32 groups), so a warp's groups are one block's.
    const int per = ((groups + gridDim.y - 1) / gridDim.y + 31) / 32 * 32;
    s.row = blockIdx.x;
    s.t = threadIdx.x;
    s.threads = kBlockThreads;
    s.begin = blockIdx.y * per;
    s.end = min(groups, s.begin + per);
    return true;
  }
}

template <bool kWarp>
__device__ __forceinline__ float group_total(float v, float* scratch) {
  if constexpr (kWarp) {
    return warp_sum(v);
  } else {
    return block_reduce<false>(v, scratch);
  }
}

// y's fp8 rows (RmsNormParams::y_fp8) from the values this warp just computed: its 32 lanes hold
// the 4-column groups of one 128-column block (fused_fp8's condition), and the group encoder
// (query_fp8.cuh) gives quantize_fp8_rows' bytes and scale exactly.
__device__ __forceinline__ void store_fp8_block(const Fp8Rows& out, int64_t row, int c0, float4 v) {
  const float e[4] = {v.x, v.y, v.z, v.w};
  uint32_t bytes = 0;
  const float scale = encode_fp8_head<true>(e, bytes);
  *reinterpret_cast<uint32_t*>(out.codes + row * out.ld + c0) = bytes;
  if ((threadIdx.x & 31) == 0)
    out.scales[int64_t(c0 / kFp8BlockCols) * out.ld_scales + row] = scale;
}

template <bool kWarp>
__global__ void __launch_bounds__(kBlockThreads) rmsnorm_kernel(RmsNormParams p, bool vec) {
  pdl_enter();
  __shared__ float scratch[32];
  RowSpot s;
  if (!row_spot<kWarp>(p.rows, p.dim, s)) return;  // a whole warp (warp mode only)
  const float* x = p.x + s.row * p.ld_x;
  float* y = p.y + s.row * p.ld_y;
  Bf16* yb = p.y_bf16 ? p.y_bf16 + s.row * p.ld_y_bf16 : nullptr;
  const int g0 = s.begin + s.t;
  const float4 w0 = first_weights(p.weight, g0, s.end, p.dim, vec);
  const float sum =
      norm_thread_sum(x, p.dim, vec, s.t, s.threads, [](float v) { return __fmul_rn(v, v); });
  const float inv_rms = rms_inverse(group_total<kWarp>(sum, scratch), p.dim, p.eps);
  for_own_groups(
      x, p.weight, w0, g0, s.end, s.threads, p.dim, vec, [&](int c0, float4 v, float4 w) {
        const float4 out = make_float4(rms_value(v.x, inv_rms, w.x), rms_value(v.y, inv_rms, w.y),
                                       rms_value(v.z, inv_rms, w.z), rms_value(v.w, inv_rms, w.w));
        store4(y, c0, p.dim, vec, out);
        if (yb) store4_bf16(yb, c0, p.dim, vec, out);
        if (p.y_fp8.codes) store_fp8_block(p.y_fp8, s.row, c0, out);
      });
}

template <bool kWarp>
__global__ void __launch_bounds__(kBlockThreads) layernorm_kernel(LayerNormParams p, bool vec) {
  pdl_enter();
  __shared__ float scratch[32];
  RowSpot s;
  if (!row_spot<kWarp>(p.rows, p.dim, s)) return;
  const float* x = p.x + s.row * p.ld_x;
  float* y = p.y + s.row * p.ld_y;
  const int g0 = s.begin + s.t;
  const float4 w0 = first_weights(p.weight, g0, s.end, p.dim, vec);
  const float sum = norm_thread_sum(x, p.dim, vec, s.t, s.threads, [](float v) { return v; });
  const float mean = __fdiv_rn(group_total<kWarp>(sum, scratch), float(p.dim));
  const float sq = norm_thread_sum(x, p.dim, vec, s.t, s.threads, [mean](float v) {
    const float d = __fsub_rn(v, mean);
    return __fmul_rn(d, d);
  });
  const float inv_std = layernorm_inverse(group_total<kWarp>(sq, scratch), p.dim, p.eps);
  for_own_groups(x, p.weight, w0, g0, s.end, s.threads, p.dim, vec,
                 [&](int c0, float4 v, float4 w) {
                   store4(y, c0, p.dim, vec,
                          make_float4(layernorm_value(v.x, mean, inv_std, w.x, p.bias, c0),
                                      layernorm_value(v.y, mean, inv_std, w.y, p.bias, c0 + 1),
                                      layernorm_value(v.z, mean, inv_std, w.z, p.bias, c0 + 2),
                                      layernorm_value(v.w, mean, inv_std, w.w, p.bias, c0 + 3)));
                 });
}

bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

// Every row starts 16-byte aligned when the base does and the stride is a multiple of 4 floats.
bool rows_aligned(const float* x, int64_t ld) { return aligned16(x) && ld % 4 == 0; }

bool rows_ok(const void* x, const void* y, const void* w, int rows, int dim, int64_t ld_x,
             int64_t ld_y) {
  return rows >= 0 && dim > 0 && ld_x >= dim && ld_y >= dim && (rows == 0 || (x && y && w));
}

// Whether the rows of y can share bytes with the rows of x.
bool overlaps(const float* x, int64_t ld_x, const float* y, int64_t ld_y, int rows, int dim) {
  const auto begin_x = reinterpret_cast<uintptr_t>(x), begin_y = reinterpret_cast<uintptr_t>(y);
  const uintptr_t end_x = begin_x + (uintptr_t(rows - 1) * ld_x + dim) * sizeof(float);
  const uintptr_t end_y = begin_y + (uintptr_t(rows - 1) * ld_y + dim) * sizeof(float);
  return begin_x < end_y && begin_y < end_x;
}

// Parts per long row: enough CTAs for about two per SM, at most one per 256 groups of 4 columns,
// and 1 when y overlaps x. Only which CTA writes a column depends on it, never a value.
unsigned row_parts(int rows, int dim, bool overlap) {
  const int groups = (dim + 3) / 4;
  const int most = (groups + kBlockThreads - 1) / kBlockThreads;
  if (overlap || most <= 1) return 1;
  const int sms = device_sm_count();
  const int want = sms > 0 ? (2 * sms + rows - 1) / rows : 1;
  return unsigned(want < 1 ? 1 : (want < most ? want : most));
}

template <typename Params, typename WarpKernel, typename BlockKernel>
cudaError_t launch_norm(const Params& p, bool vec, WarpKernel warp, BlockKernel block,
                        cudaStream_t stream) {
  if (p.dim <= kWarpRowMaxDim) {
    launch_kernel(warp, ceil_div(p.rows, kWarpRowsPerCta), 32 * kWarpRowsPerCta, 0, stream, p, vec);
  } else {
    const bool overlap = overlaps(p.x, p.ld_x, p.y, p.ld_y, p.rows, p.dim);
    const dim3 grid(unsigned(p.rows), row_parts(p.rows, p.dim, overlap));
    launch_kernel(block, grid, kBlockThreads, 0, stream, p, vec);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t rmsnorm(const RmsNormParams& p, cudaStream_t stream) {
  if (!rows_ok(p.x, p.y, p.weight, p.rows, p.dim, p.ld_x, p.ld_y)) return cudaErrorInvalidValue;
  if (p.y_bf16 && p.ld_y_bf16 < p.dim) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const bool vec = p.dim % 4 == 0 && rows_aligned(p.x, p.ld_x) && rows_aligned(p.y, p.ld_y) &&
                   aligned8(p.weight) &&
                   (!p.y_bf16 || (aligned8(p.y_bf16) && p.ld_y_bf16 % 4 == 0));
  // y's fp8 rows in the norm's own write pass when every warp's lanes cover one whole block:
  // 4-column groups (vec) and whole blocks; else quantized from y once the norm is done (the
  // same encoder on the same values: the same bytes).
  if (!p.y_fp8.codes || (vec && p.dim % kFp8BlockCols == 0)) {
    return launch_norm(p, vec, rmsnorm_kernel<true>, rmsnorm_kernel<false>, stream);
  }
  RmsNormParams plain = p;
  plain.y_fp8 = {};
  const cudaError_t err =
      launch_norm(plain, vec, rmsnorm_kernel<true>, rmsnorm_kernel<false>, stream);
  return err != cudaSuccess ? err
                            : quantize_fp8_rows(p.y, p.ld_y, p.rows, p.dim, p.y_fp8, false, stream);
}

cudaError_t layernorm(const LayerNormParams& p, cudaStream_t stream) {
  if (!rows_ok(p.x, p.y, p.weight, p.rows, p.dim, p.ld_x, p.ld_y)) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const bool vec = p.dim % 4 == 0 && rows_aligned(p.x, p.ld_x) && rows_aligned(p.y, p.ld_y) &&
                   aligned8(p.weight);
  return launch_norm(p, vec, layernorm_kernel<true>, layernorm_kernel<false>, stream);
}

}  // namespace dsa::cuda
