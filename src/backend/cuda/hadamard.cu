// Walsh-Hadamard rotation, in place. Each element goes through the same additions as in
// cpu/hadamard.cpp, so the result is bit-identical to the CPU.
//   dim >= 32: a warp per row, 4 rows per CTA, the row in registers (hadamard.cuh).
//   dim < 32:  a block per row, the row in shared memory, a barrier between stages.
#include "backend/cuda/common.cuh"
#include "backend/cuda/hadamard.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"

namespace dsa::cuda {
namespace {

constexpr int kMaxDim = 1024;
constexpr int kWarpRows = 4;  // rows (warps) per CTA of the warp kernel

template <int kPer>
__global__ void __launch_bounds__(32 * kWarpRows) hadamard_warp_kernel(HadamardParams p, bool vec) {
  pdl_enter();
  const int64_t row = int64_t(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (row >= p.rows) return;  // the whole warp
  const int lane = threadIdx.x & 31;
  float* x = p.x + row * p.ld + lane * kPer;
  float v[kPer];
  if constexpr (kPer % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < kPer; i += 4) {
        const float4 q = *reinterpret_cast<const float4*>(x + i);
        v[i] = q.x, v[i + 1] = q.y, v[i + 2] = q.z, v[i + 3] = q.w;
      }
    }
  }
  if (kPer % 4 != 0 || !vec) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) v[i] = x[i];
  }
  warp_hadamard<kPer>(v, lane);
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = __fmul_rn(v[i], p.scale);
  if constexpr (kPer % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < kPer; i += 4) {
        *reinterpret_cast<float4*>(x + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) x[i] = v[i];
}

__global__ void __launch_bounds__(kMaxDim / 2) hadamard_kernel(HadamardParams p) {
  pdl_enter();
  __shared__ float v[kMaxDim];
  float* x = p.x + blockIdx.x * p.ld;
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x) v[i] = x[i];
  __syncthreads();
  for (int span = 1; span < p.dim; span *= 2) {
    for (int j = threadIdx.x; j < p.dim / 2; j += blockDim.x) {
      const int i = (j / span) * 2 * span + j % span;  // first element of pair j
      const float a = v[i], b = v[i + span];
      v[i] = __fadd_rn(a, b);
      v[i + span] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x) x[i] = __fmul_rn(v[i], p.scale);
}

template <int kPer>
void launch_warp(const HadamardParams& p, bool vec, cudaStream_t stream) {
  launch_kernel(hadamard_warp_kernel<kPer>, ceil_div(p.rows, kWarpRows), 32 * kWarpRows, 0, stream,
                p, vec);
}

}  // namespace

cudaError_t hadamard(const HadamardParams& p, cudaStream_t stream) {
  const bool power_of_two = p.dim > 0 && (p.dim & (p.dim - 1)) == 0;
  if (!power_of_two || p.dim > kMaxDim || p.rows < 0 || p.ld < p.dim) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (!p.x) return cudaErrorInvalidValue;
  const bool vec = aligned16(p.x) && p.ld % 4 == 0;
  switch (p.dim) {
    case 32:
      launch_warp<1>(p, vec, stream);
      break;
    case 64:
      launch_warp<2>(p, vec, stream);
      break;
    case 128:
      launch_warp<4>(p, vec, stream);
      break;
    case 256:
      launch_warp<8>(p, vec, stream);
      break;
    case 512:
      launch_warp<16>(p, vec, stream);
      break;
    case 1024:
      launch_warp<32>(p, vec, stream);
      break;
    default: {
      const int threads = p.dim / 2 < 32 ? 32 : p.dim / 2;
      launch_kernel(hadamard_kernel, p.rows, threads, 0, stream, p);
    }
  }
  return cudaGetLastError();
}

}  // namespace dsa::cuda
