// Error checks of the CUDA backend's host code: a failed CUDA runtime or cuBLAS call becomes a
// dsa::Error (kBackend) naming the statement, the device and the caller's file:line.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstddef>
#include <source_location>
#include <string>

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

// cudaMalloc of `bytes` (256 when 0; 256-byte aligned), or kResourceExhausted naming the device
// (label(): its name, asked for only then).
template <class Label>
void* device_alloc(size_t bytes, Label&& label) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes ? bytes : 256);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    fail(ErrorCode::kResourceExhausted, "cudaMalloc of {} bytes failed on {}: {}", bytes, label(),
         cudaGetErrorString(err));
  }
  return p;
}

// The check after every launcher: names the op and the device (label(), asked for only on an
// error), and says when a kernel is not written yet.
template <class Label>
void check_launch(cudaError_t err, const char* op, Label&& label,
                  std::source_location loc = std::source_location::current()) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  if (err == cudaErrorNotSupported) {
    throw_error(ErrorCode::kBackend,
                fmt::format("dsa::cuda::{} is not implemented on {} yet", op, label()), loc);
  }
  throw_error(ErrorCode::kBackend,
              fmt::format("dsa::cuda::{} launch failed on {}: {} ({}); invalid value means bad "
                          "params (shape, stride, null or misaligned pointer)",
                          op, label(), cudaGetErrorString(err), cudaGetErrorName(err)),
              loc);
}

}  // namespace dsa::cuda
