// What the CUDA backend exposes beyond dsa::Backend, for benchmarks and tools that launch their
// own work next to the backend's. Includes no fmt, so .cu files may include it too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsa/backend.h"

namespace dsa {

// The stream every op of a CUDA backend runs on. Throws kInvalidArgument for another backend.
cudaStream_t cuda_stream(Backend& backend);

namespace cuda {

// out_b[r, :] = bf16(x_b[r, :cols]) for the fast (cuBLASLt) GEMM path: out is dense, [batch][rows,
// cols], batch stride rows * cols. elementwise.cu.
cudaError_t convert_to_bf16(const float* x, int rows, int cols, int64_t ld_x, int batch,
                            int64_t batch_stride_x, Bf16* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace dsa
