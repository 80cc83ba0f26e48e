// Rotary position embedding, in place: one thread per (row, head, pair). The same products and
// sums as cpu/rope.cpp with explicit round-to-nearest intrinsics (no FMA contraction), so the
// result is bit-identical to the CPU. A position outside [0, max_position) leaves its row alone.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace dsa::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rope_kernel(RopeParams p, int64_t total) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= total) return;
  const int half = p.rope_dim / 2;
  const int i = int(t % half);
  const int h = int((t / half) % p.heads);
  const int64_t r = t / (int64_t(half) * p.heads);
  const int32_t position = p.positions[r];
  if (position < 0 || position >= p.max_position) return;
  const float* angle = p.cos_sin + int64_t(position) * p.rope_dim + 2 * i;
  const bool interleaved = p.style == RopeStyle::kInterleaved;
  float* a = p.x + r * p.ld_row + h * p.ld_head + p.offset + (interleaved ? 2 * i : i);
  float* b = a + (interleaved ? 1 : half);
  const float c = angle[0], s = angle[1];
  const float x = *a, y = *b;
  *a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  *b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}

}  // namespace

cudaError_t rope(const RopeParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.heads < 0 || p.rope_dim <= 0 || p.rope_dim % 2 || p.offset < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = int64_t(p.rows) * p.heads * (p.rope_dim / 2);
  if (total == 0) return cudaSuccess;
  if (!p.x || !p.positions || !p.cos_sin) return cudaErrorInvalidValue;
  rope_kernel<<<ceil_div(total, kThreads), kThreads, 0, stream>>>(p, total);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
