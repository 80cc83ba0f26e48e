// Programmatic dependent launch (Hopper): a kernel may be launched while the kernel before it in
// the stream is still running, so its launch and block placement overlap the other's tail instead
// of following its completion. One rule makes that safe for every kernel of the backend: the
// first statement of every kernel is pdl_enter(), which lets the next kernel launch
// (griddepcontrol.launch_dependents) and then waits until the previous kernel has completed and
// its memory is visible (griddepcontrol.wait). Nothing of the kernel runs before that wait, so a
// kernel sees exactly what it sees in plain stream order, and it completes only after its wait
// returned, so the kernel after it waits for every kernel before it too. Without the launch
// attribute both instructions do nothing.
//
// One exception, stated per call: the bulk-copy GEMM kernels (bf16 and w8a8) copy the weights of
// their first stages before the wait when the call says no earlier kernel writes them
// (GemmParams::w_constant, TcParams::w_early; produce_stages in gemm_wgmma.cuh). Every other
// access of theirs, and every write, follows the wait: the producer waits before its first x
// copy, every consumer thread before it reads or writes global memory.
//
// launch_kernel() is the backend's one way to launch a kernel: the launch attribute is set when
// DSA_CUDA_PDL=on (read at every launch; default off until it has run on the H200; the same bits
// either way, only the time between kernels moves). Graph capture keeps the attribute as a
// programmatic edge, so a replayed decode step gets it too. Launches of other libraries (cuBLASLt)
// and copies keep plain stream order around it.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace dsa::cuda {

#ifdef __CUDACC__
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_enter() {
  pdl_launch_dependents();
  pdl_wait();
}
#endif

// DSA_CUDA_PDL=on (env_knobs.cpp refuses values other than on and off).
inline bool pdl_enabled() {
  const char* v = std::getenv("DSA_CUDA_PDL");
  return v != nullptr && std::strcmp(v, "on") == 0;
}

// Appends the programmatic-launch attribute to config's attributes when PDL is on. `attrs` is the
// array config.attrs points to (or will), with room for one more.
inline void add_pdl_attribute(cudaLaunchConfig_t& config, cudaLaunchAttribute* attrs) {
  if (!pdl_enabled()) return;
  attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[config.numAttrs].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attrs;
  ++config.numAttrs;
}

// The launch configuration of <<<grid, block, smem, stream>>>, with no attribute.
inline cudaLaunchConfig_t kernel_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  return config;
}

// kernel<<<grid, block, smem, stream>>>(args...), with the attribute when PDL is on. The arguments
// convert to the kernel's parameter types as in a call.
template <typename... Expected, typename... Actual>
cudaError_t launch_kernel(void (*kernel)(Expected...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Actual&&... args) {
  cudaLaunchConfig_t config = kernel_config(grid, block, smem, stream);
  cudaLaunchAttribute attrs[1];
  add_pdl_attribute(config, attrs);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Actual>(args)...);
}

}  // namespace dsa::cuda
