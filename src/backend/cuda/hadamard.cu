// Walsh-Hadamard rotation, in place: one block per row, the row in shared memory, log2(dim)
// butterfly stages of span 1, 2, 4, ... with a barrier between stages. Each element goes through
// the same additions as in cpu/hadamard.cpp, so the result is bit-identical to the CPU.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace dsa::cuda {
namespace {

constexpr int kMaxDim = 1024;

__global__ void __launch_bounds__(kMaxDim / 2) hadamard_kernel(HadamardParams p) {
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

}  // namespace

cudaError_t hadamard(const HadamardParams& p, cudaStream_t stream) {
  const bool power_of_two = p.dim > 0 && (p.dim & (p.dim - 1)) == 0;
  if (!power_of_two || p.dim > kMaxDim || p.rows < 0 || p.ld < p.dim) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (!p.x) return cudaErrorInvalidValue;
  const int threads = p.dim / 2 < 32 ? 32 : p.dim / 2;
  hadamard_kernel<<<p.rows, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
