// tma.cuh's host side: tensor maps for the bulk tensor copy engine, encoded by the driver's
// cuTensorMapEncodeTiled, which is looked up once through the runtime (no link to libcuda).
#include "backend/cuda/tma.cuh"

namespace dsa::cuda {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

}  // namespace

bool encode_tile_map(CUtensorMap* map, TileMap kind, const void* base, int64_t cols, int64_t rows,
                     int64_t batch, int64_t row_stride, int64_t batch_stride, int box_cols,
                     int box_rows) {
  const EncodeTiled encode = encoder();
  const bool bf16 = kind == TileMap::kBf16Swizzle128;
  const bool swizzled = kind != TileMap::kBytesPlain;
  const int elem = bf16 ? 2 : 1;
  // The 128-byte swizzle takes rows of exactly 128 bytes here (wgmma.cuh's layout); plain boxes
  // any multiple of 16 bytes.
  if (!encode || cols <= 0 || rows <= 0 || batch <= 0 ||
      (swizzled ? box_cols * elem != 128 : (box_cols * elem) % 16 != 0)) {
    return false;
  }
  // One batch entry: the batch stride is never stepped; any valid one (the whole matrix) serves.
  if (batch == 1) batch_stride = row_stride * rows;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(batch)};
  const cuuint64_t strides[2] = {cuuint64_t(row_stride) * elem, cuuint64_t(batch_stride) * elem};
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 3,
                const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzled ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace dsa::cuda
