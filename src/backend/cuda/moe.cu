// MoE routing and per-row scaling on the device.
//   moe_route:  one thread per row, the CPU's selection loop and f32 operation order (explicit
//               _rn intrinsics, no contraction). The ids match the CPU exactly unless expf's
//               last-ulp difference from the host's exp flips a near-tie; weights agree to nmse
//               ~1e-14.
//   scale_rows: one rounded multiply per element: bit-identical to the CPU.
// Both are batch-invariant: a row reads only its own inputs.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"

namespace dsa::cuda {
namespace {

constexpr int kRouteThreads = 64;
constexpr int kScaleThreads = 256;

// A larger choice ranks first; a NaN ranks below every number (the CPU's ranks_above).
__device__ __forceinline__ bool ranks_above(float a, float b) {
  if (isnan(a)) return false;
  if (isnan(b)) return true;
  return a > b;
}

__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(MoeRouteParams p) {
  pdl_enter();
  const int r = blockIdx.x * kRouteThreads + threadIdx.x;
  if (r >= p.rows) return;
  const float* logits = p.logits + int64_t(r) * p.ld_logits;
  float* weights = p.weights + int64_t(r) * p.ld_weights;
  float score[kMaxRoutedExperts];
  uint32_t chosen[kMaxRoutedExperts / 32];
  for (int w = 0; w < kMaxRoutedExperts / 32; ++w) chosen[w] = 0;
  for (int e = 0; e < p.n_experts; ++e) {
    score[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logits[e])));
  }
  auto choice = [&](int e) {
    return p.bias ? __fadd_rn(score[e], bf16_to_float(p.bias[e])) : score[e];
  };
  float sum = 0.0f;
  for (int k = 0; k < p.top_k; ++k) {
    int best = -1;
    float best_choice = 0.0f;
    for (int e = 0; e < p.n_experts; ++e) {
      if (chosen[e >> 5] & (1u << (e & 31))) continue;
      const float c = choice(e);
      if (best < 0 || ranks_above(c, best_choice)) {
        best = e;
        best_choice = c;
      }
    }
    chosen[best >> 5] |= 1u << (best & 31);
    sum = __fadd_rn(sum, score[best]);
    if (p.expert_ids) p.expert_ids[int64_t(r) * p.ld_expert_ids + k] = best;
  }
  const float denominator = __fadd_rn(sum, 1e-20f);
  for (int e = 0; e < p.n_experts; ++e) {
    const bool selected = chosen[e >> 5] & (1u << (e & 31));
    weights[e] = selected ? __fmul_rn(__fdiv_rn(score[e], denominator), p.scaling) : 0.0f;
  }
}

__global__ void __launch_bounds__(kScaleThreads)
    scale_rows_kernel(ScaleRowsParams p, int64_t total) {
  pdl_enter();
  const int64_t t = int64_t(blockIdx.x) * kScaleThreads + threadIdx.x;
  if (t >= total) return;
  const int64_t r = t / p.dim, i = t % p.dim;
  float* x = p.x + r * p.ld_x + i;
  *x = __fmul_rn(*x, p.scale[r * p.ld_scale]);
}

}  // namespace

cudaError_t moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.n_experts < 1 || p.n_experts > kMaxRoutedExperts || p.top_k < 1 ||
      p.top_k > p.n_experts || p.ld_logits < p.n_experts || p.ld_weights < p.n_experts ||
      (p.expert_ids && p.ld_expert_ids < p.top_k)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (!p.logits || !p.weights) return cudaErrorInvalidValue;
  launch_kernel(moe_route_kernel, (p.rows + kRouteThreads - 1) / kRouteThreads, kRouteThreads, 0,
                stream, p);
  return cudaGetLastError();
}

cudaError_t scale_rows(const ScaleRowsParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim < 0 || p.ld_x < p.dim) return cudaErrorInvalidValue;
  const int64_t total = int64_t(p.rows) * p.dim;
  if (total == 0) return cudaSuccess;
  if (!p.x || !p.scale) return cudaErrorInvalidValue;
  launch_kernel(scale_rows_kernel, (total + kScaleThreads - 1) / kScaleThreads, kScaleThreads, 0,
                stream, p, total);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
