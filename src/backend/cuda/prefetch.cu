// prefetch_l2: bytes of device memory brought into L2 ahead of the kernel that will read them
// (cp.async.bulk.prefetch.L2, Hopper's TMA bulk prefetch). The kernel only issues the requests;
// the lines arrive while the kernels after it run, so a step can fill L2 with the next GEMM's
// weights while its own work leaves the memory bus idle. A hint: it writes nothing, and no value
// of any op depends on it.
#include <algorithm>

#include "backend/cuda/launch.h"

namespace dsa::cuda {
namespace {

constexpr uint32_t kPrefetchChunk = 32 << 10;  // bytes per bulk prefetch request

__global__ void prefetch_l2_kernel(const uint8_t* p, uint64_t bytes) {
  pdl_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t chunks = (bytes + kPrefetchChunk - 1) / kPrefetchChunk;
  for (uint64_t c = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t at = c * kPrefetchChunk;
    const uint32_t size = uint32_t(bytes - at < kPrefetchChunk ? bytes - at : kPrefetchChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + at), "r"(size) : "memory");
  }
#endif
}

}  // namespace

cudaError_t prefetch_l2(const void* p, size_t bytes, cudaStream_t stream) {
  // Whole 16-byte units inside [p, p + bytes): the request's alignment and size rule.
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t(15);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t(15);
  if (p == nullptr || end <= begin) return cudaSuccess;
  const uint64_t n = end - begin;
  const uint64_t chunks = (n + kPrefetchChunk - 1) / kPrefetchChunk;
  const unsigned threads = 128;
  const unsigned blocks = unsigned(std::min<uint64_t>(8, (chunks + threads - 1) / threads));
  const cudaError_t err = launch_kernel(prefetch_l2_kernel, dim3(blocks), dim3(threads), 0, stream,
                                        reinterpret_cast<const uint8_t*>(begin), n);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace dsa::cuda
