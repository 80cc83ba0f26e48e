// Rotary position embedding, in place: one thread per (row, head, pair). The same products and
// sums as cpu/rope.cpp with explicit round-to-nearest intrinsics (no FMA contraction), so the
// result is bit-identical to the CPU. A position outside [0, max_position) leaves its row alone.
// With p.out set, each thread also writes its pair to the copy (the fused rope + copy_rows).
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/rope.cuh"

namespace dsa::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) rope_kernel(RopeParams p, int64_t total) {
  pdl_enter();
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= total) return;
  const int half = p.rope_dim / 2;
  const int i = int(t % half);
  const int h = int((t / half) % p.heads);
  const int64_t r = t / (int64_t(half) * p.heads);
  const int32_t position = p.positions[r];
  const bool rotate = position >= 0 && position < p.max_position;
  const bool interleaved = p.style == RopeStyle::kInterleaved;
  const int first = interleaved ? 2 * i : i, second = first + (interleaved ? 1 : half);
  float* head = p.x + r * p.ld_row + h * p.ld_head + p.offset;
  float a = head[first], b = head[second];
  if (rotate) {
    const float* angle = p.cos_sin + int64_t(position) * p.rope_dim + 2 * i;
    rope_pair(a, b, angle[0], angle[1]);
    head[first] = a;
    head[second] = b;
  }
  if (p.out) {
    float* out = p.out + r * p.ld_out_row + h * p.ld_out_head;
    out[first] = a;
    out[second] = b;
  }
}

}  // namespace

cudaError_t rope(const RopeParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.heads < 0 || p.rope_dim <= 0 || p.rope_dim % 2 || p.offset < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = int64_t(p.rows) * p.heads * (p.rope_dim / 2);
  if (total == 0) return cudaSuccess;
  if (!p.x || !p.positions || !p.cos_sin) return cudaErrorInvalidValue;
  launch_kernel(rope_kernel, ceil_div(total, kThreads), kThreads, 0, stream, p, total);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
