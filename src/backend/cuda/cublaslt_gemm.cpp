// cublaslt_gemm.h's CublasLtGemm.
#include "backend/cuda/cublaslt_gemm.h"

#include "backend/cuda/cuda_check.h"
#include "dsa/error.h"

namespace dsa::cuda {

void CublasLtGemm::create() {
  if (handle_) return;
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate(&handle_)", device_);
  check_cuda(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc(&workspace_, kWorkspaceBytes)",
             device_);
}

void CublasLtGemm::release() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
  workspace_ = nullptr, handle_ = nullptr;
}

// cuBLASLt is column-major, so it computes y^T [n, m] = op(w) [n, k] * x^T [k, m]: a row-major
// [m, k] matrix is a column-major [k, m] one.
void CublasLtGemm::run(const GemmParams& p, const Bf16* xb, int64_t ld_xb, int64_t bs_xb,
                       cudaStream_t stream, const std::string& label) {
  create();
  const int dev = device_;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto destroy_descriptors = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  };
  try {
    check_cublas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "cublasLtMatmulDescCreate", dev);
    const cublasOperation_t op_w = p.layout == WeightLayout::kNK ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_x = CUBLAS_OP_N;
    check_cublas(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)),
        "cublasLtMatmulDescSetAttribute(TRANSA)", dev);
    check_cublas(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_x, sizeof(op_x)),
        "cublasLtMatmulDescSetAttribute(TRANSB)", dev);
    // w as stored, column-major: kNK is [k, n] (transposed by op_w), kKN is [n, k].
    const bool nk = p.layout == WeightLayout::kNK;
    check_cublas(
        cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, nk ? p.k : p.n, nk ? p.n : p.k, p.ld_w),
        "cublasLtMatrixLayoutCreate(w)", dev);
    check_cublas(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, p.k, p.m, ld_xb),
                 "cublasLtMatrixLayoutCreate(x)", dev);
    check_cublas(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, p.n, p.m, p.ld_y),
                 "cublasLtMatrixLayoutCreate(y)", dev);
    if (p.batch > 1) {
      const int32_t count = p.batch;
      const int64_t strides[3] = {p.batch_stride_w, bs_xb, p.batch_stride_y};
      cublasLtMatrixLayout_t layouts[3] = {a, b, d};
      for (int i = 0; i < 3; ++i) {
        check_cublas(cublasLtMatrixLayoutSetAttribute(
                         layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                     "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", dev);
        check_cublas(cublasLtMatrixLayoutSetAttribute(layouts[i],
                                                      CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &strides[i], sizeof(strides[i])),
                     "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", dev);
      }
    }
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", dev);
    const uint64_t ws = kWorkspaceBytes;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                 "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", dev);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    check_cublas(
        cublasLtMatmulAlgoGetHeuristic(handle_, desc, a, b, d, d, pref, 1, &heuristic, &found),
        "cublasLtMatmulAlgoGetHeuristic", dev);
    require(found > 0, ErrorCode::kBackend,
            "cuBLASLt has no bf16 algorithm on {} for m {} n {} k {} batch {}", label, p.m, p.n,
            p.k, p.batch);
    const float alpha = p.alpha;
    const float beta = p.output == GemmOutput::kAccumulate ? 1.0f : 0.0f;
    check_cublas(cublasLtMatmul(handle_, desc, &alpha, p.w, a, xb, b, &beta, p.y, d, p.y, d,
                                &heuristic.algo, workspace_, kWorkspaceBytes, stream),
                 "cublasLtMatmul", dev);
  } catch (...) {
    destroy_descriptors();
    throw;
  }
  destroy_descriptors();
}

}  // namespace dsa::cuda
