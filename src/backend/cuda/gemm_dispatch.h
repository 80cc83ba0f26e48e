// The CUDA backend's GEMM (Backend::gemm): the path of each GemmMode (exact, the batch-invariant
// kernels with their fp8 and w8a8 variants, cuBLASLt), the kernel choices of the environment
// (DSA_CUDA_GEMM, _FP8, _FP8_TILE, _KN, _REDUCE), the invariant GEMM's tuning, and per lane the
// memory a GEMM needs besides its operands: x as bf16 or e4m3, the split-K partials, and a cuBLASLt
// handle with its workspace. GEMMs on the backend's two lanes may run at once, so they never share
// any of it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <source_location>
#include <string>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_backend.h"
#include "dsa/backend.h"
#include "dsa/ops.h"

namespace dsa::cuda {

class GemmDispatch {
 public:
  static constexpr int kLanes = 2;  // Backend::Lane's, by index

  // Reads the GEMM's environment knobs, refusing an unknown value (kInvalidArgument). label():
  // the device's name for messages, asked for only when one needs it.
  GemmDispatch(int device, std::function<const std::string&()> label);
  GemmDispatch(const GemmDispatch&) = delete;
  GemmDispatch& operator=(const GemmDispatch&) = delete;
  ~GemmDispatch() { release(); }
  // Frees every lane's scratch and handle (the caller has synchronized); later GEMMs make them
  // again.
  void release();

  // The invariant GEMM's knobs (set_gemm_invariant_tuning); kInvalidArgument when out of range.
  void set_tuning(const GemmInvariantTuning& tuning);
  // Makes lane `lane`'s cuBLASLt handle and workspace now (else on its first fast GEMM).
  void create_cublas(int lane);
  // Sizes lane `lane`'s x scratch for x of up to x_elements (batch * m * k) and its partials for m
  // of up to max_rows, growing them now (on `stream`) so no captured GEMM needs to.
  void reserve(int lane, size_t x_elements, int max_rows, cudaStream_t stream);
  // y for p in `mode`, queued on `stream` with lane `lane`'s memory.
  void run(const GemmParams& p, GemmMode mode, int lane, cudaStream_t stream);

 private:
  struct Queue {  // where a GEMM runs: its lane's memory and its stream
    int lane;
    cudaStream_t stream;
  };
  struct XBf16 {  // bf16(x): the producer's copy (batch 1), else the scratch's ([batch][m, k])
    const Bf16* data;
    int64_t ld, batch_stride;
  };
  void invariant(const GemmParams& p, Queue q);
  void w8a8(const GemmParams& p, const GemmInvariantTuning& tuning, Queue q);
  void cublaslt(const GemmParams& p, Queue q);
  XBf16 x_as_bf16(const GemmParams& p, Queue q, bool aligned = false);
  GemmInvariantTuning resolved(GemmInvariantTuning tuning) const;
  Bf16* x_scratch(size_t elems, Queue q);
  float* partials(size_t floats, Queue q);
  void* grown(void*& buffer, size_t& capacity, size_t bytes, const char* what, Queue q);
  void check(cudaError_t err, const char* statement,
             std::source_location loc = std::source_location::current()) const;
  void launched(cudaError_t err, const char* op,
                std::source_location loc = std::source_location::current()) const;

  struct LaneScratch {
    void* x = nullptr;
    size_t x_bytes = 0;
    void* partials = nullptr;
    size_t partial_bytes = 0;
  };
  int device_;
  std::function<const std::string&()> label_;
  GemmKernel kernel_;  // the invariant GEMM's kernel when the tuning names none
  int fp8_;            // its fp8 kernel when the tuning names none (0 mma, 1 wgmma)
  int fp8_tile_;       // its wgmma fp8 tile when the tuning names none (-1: per shape)
  int kn_;             // its kKN kernel when the tuning names none (0 mma, 1 wgmma)
  int reduce_;         // its split reduction when the tuning names none (-1 auto, 2, 3)
  GemmInvariantTuning tuning_;
  CublasLtGemm cublas_[kLanes] = {CublasLtGemm{device_}, CublasLtGemm{device_}};
  LaneScratch scratch_[kLanes];
};

}  // namespace dsa::cuda
