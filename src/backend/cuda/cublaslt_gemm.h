// The fast GEMM mode (GemmMode::kFast, `--gemm fast`): cuBLASLt on bf16 x, f32 accumulation and
// output. Not batch-invariant: cuBLASLt picks its algorithm, so its reduction order, by m.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "dsa/ops.h"

namespace dsa::cuda {

// A cuBLASLt handle and its workspace on one device, made on first use and freed by release()
// (or the destructor): the backend frees them before it gives the thread's device back.
class CublasLtGemm {
 public:
  explicit CublasLtGemm(int device) : device_(device) {}
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;
  ~CublasLtGemm() { release(); }

  void create();   // the handle and the workspace, once, on the current device
  void release();  // frees both; a later create() makes them again

  // y (+)= alpha * x * w for p (m, n, k, batch > 0; bf16 weights), x as bf16 at xb with row
  // stride ld_xb and batch stride bs_xb, enqueued on `stream`. `label` names the device in errors.
  void run(const GemmParams& p, const Bf16* xb, int64_t ld_xb, int64_t bs_xb, cudaStream_t stream,
           const std::string& label);

 private:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
  int device_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace dsa::cuda
