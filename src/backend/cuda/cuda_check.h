// Error checks of the CUDA backend's host code: a failed CUDA runtime or cuBLAS call becomes a
// dsa::Error (kBackend) naming the statement, the device and the caller's file:line.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <source_location>

#include "dsa/error.h"

namespace dsa::cuda {

inline void check_cuda(cudaError_t err, const char* statement, int device,
                       std::source_location loc = std::source_location::current()) {
  if (err == cudaSuccess) return;
  throw_error(ErrorCode::kBackend,
              fmt::format("{} failed on cuda:{}: {} ({})", statement, device,
                          cudaGetErrorString(err), cudaGetErrorName(err)),
              loc);
}

inline void check_cublas(cublasStatus_t status, const char* statement, int device,
                         std::source_location loc = std::source_location::current()) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_error(ErrorCode::kBackend,
              fmt::format("{} failed on cuda:{}: cuBLAS status {}", statement, device, int(status)),
              loc);
}

}  // namespace dsa::cuda
