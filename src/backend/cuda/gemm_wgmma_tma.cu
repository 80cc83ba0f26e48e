// The wgmma batch-invariant GEMM with a warp-specialized bulk-copy pipeline: the same chains as
// gemm_wgmma.cu (its header: the roles, the split plan, one chain of wgmma.m64nNk16 per element
// from +0 over the slice's k16 blocks in ascending order, the last stage issuing only the k16
// blocks below the slice end), so every tile here gives the bits of every tile there; only the
// way the tiles reach shared memory differs.
//
// Roles. One producer warpgroup, whose first thread issues the bulk tensor copies (tma.cuh) of
// the weight tile [kCols features][64 k] and the x tile [kRows rows][64 k] of each k stage into
// a ring of kStages stages, each completing on its stage's `full` barrier; the copy engine writes
// the 128-byte-swizzled layout of wgmma.cuh and fills with +0 everything past n (weights), past
// m (x rows: never read) and past K. kConsumers warpgroups, 64 features each, wait on `full`,
// issue the stage's wgmma, and release the stage on its `empty` barrier once the group that read
// it has completed (wgmma.wait_group 1 one stage later). Neither side waits on a CTA-wide
// barrier in the main loop, so the copies of the next kStages - 1 stages are in flight while the
// tensor cores run, and no thread of a consumer spends an instruction on loads.
//
// A slice never straddles a copy: slices start on multiples of 128 (gemm_tensor.cu), stages on
// multiples of 64 within them, and only the last slice ends short of a stage, at K, where the
// copy engine's zero fill stands in for gemm_wgmma.cu's. The consumers issue the k16 blocks below
// the slice end only, as there, so the zero fill is never multiplied.
//
// Needs 16-byte-aligned bases and row and batch strides that are multiples of 8 elements (what
// the tensor map encoder accepts); gemm_wgmma.cu falls back to its cp.async tile of the same
// shape otherwise (wgmma_tma_launch returns cudaErrorNotSupported and launches nothing).
#include <algorithm>
#include <atomic>
#include <iterator>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

constexpr int kBK = kWgmmaStageK;

template <int kConsumers_, int kN_, int kNSub_, int kStages_, int kMinBlocks_>
struct TmaConfig {
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups, 64 features each
  static constexpr int kN = kN_;                  // the wgmma N: batch rows per instruction
  static constexpr int kNSub = kNSub_;            // instructions per warpgroup and k16 block
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the registers are capped for
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kCols = 64 * kConsumers;  // output features per CTA
  static constexpr int kRows = kN * kNSub;       // rows of x per CTA
  static constexpr int kWBytes = kCols * kSwizzleRowBytes;
  static constexpr int kStageBytes = (kCols + kRows) * kSwizzleRowBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + kSwizzleAtomBytes;  // + align slack
  // setmaxnreg needs the entry cap of one CTA per SM; a consumer then holds up to 232 registers.
  static constexpr bool kRebalance = kMinBlocks == 1;
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 128, "wgmma.cuh instantiates N = 8 .. 128");
  static_assert(kRows <= 256 && kCols <= 256, "a tensor map box has at most 256 rows");
  static_assert(kStages >= 2, "one stage in the tensor cores, one landing");
  static_assert(kSmemBytes <= 227 * 1024, "an H200 CTA has at most 227 KiB of shared memory");
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    gemm_wgmma_tma_kernel(const __grid_constant__ CUtensorMap map_w,
                          const __grid_constant__ CUtensorMap map_x, TcParams p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ uint64_t full[C::kStages], empty[C::kStages];
  uint8_t* smem = align_to_atom(smem_raw);  // the swizzle atoms need 1024-byte alignment
  const uint32_t smem_base = smem_addr(smem);

  const int b = int(blockIdx.z) % p.batch, s = int(blockIdx.z) / p.batch;
  // Row tiles are the fastest grid index: the CTAs that share a weight tile run side by side.
  const int row0 = int(blockIdx.x) * C::kRows, col0 = int(blockIdx.y) * C::kCols;
  const int k_begin = s * p.slice_k;
  const int k_len = min(p.k, k_begin + p.slice_k) - k_begin;
  const int tiles = (k_len + kBK - 1) / kBK;
  // The role, read through a shuffle so that the compiler knows it is warp-uniform (else it
  // serializes the wgmma of the consumer branch as if it could diverge).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);

  if (threadIdx.x == 0) {
    for (int st = 0; st < C::kStages; ++st) {
      mbar_init(&full[st], 1);
      mbar_init(&empty[st], C::kConsumers);
    }
    mbar_init_fence();
    tma_prefetch_map(&map_w);
    tma_prefetch_map(&map_x);
  }
  __syncthreads();

  if (wg == C::kConsumers) {
    // The producer warpgroup: one thread issues every copy.
    if constexpr (C::kRebalance) warpgroup_reg_dealloc<40>();
    if (threadIdx.x % 128 == 0) {
      for (int kt = 0; kt < tiles; ++kt) {
        const int st = kt % C::kStages, use = kt / C::kStages;
        if (use > 0) mbar_wait(&empty[st], uint32_t(use - 1) & 1u);
        uint8_t* ws = smem + st * C::kStageBytes;
        mbar_arrive_expect_tx(&full[st], uint32_t(C::kStageBytes));
        const int k0 = k_begin + kt * kBK;
        tma_load_3d(ws, &map_w, k0, col0, b, &full[st]);
        tma_load_3d(ws + C::kWBytes, &map_x, k0, row0, b, &full[st]);
      }
    }
  } else {
    if constexpr (C::kRebalance) warpgroup_reg_alloc<232>();
    WgmmaChains<C::kN, C::kNSub> chains;
    chains.zero();
    const bool leader = threadIdx.x % 128 == 0;
    for (int kt = 0; kt < tiles; ++kt) {
      const int st = kt % C::kStages;
      mbar_wait(&full[st], uint32_t(kt / C::kStages) & 1u);
      const uint32_t stage = smem_base + uint32_t(st * C::kStageBytes);
      chains.stage(stage + uint32_t(wg * 64 * kSwizzleRowBytes), stage + uint32_t(C::kWBytes),
                   k_len - kt * kBK);
      wgmma_wait<1>();  // the group of stage kt - 1 has completed: release its stage
      if (kt > 0 && leader) mbar_arrive(&empty[(kt - 1) % C::kStages]);
    }
    wgmma_wait<0>();
    chains.fence();
    chains.store(p, b, s, row0, col0 + wg * 64);
    if (p.splits == 1 || !p.fused) return;
    // The consumers alone reduce (named barrier 1): the producer has left.
    finish_wgmma_tile<128 * C::kConsumers, 1>(p, b, row0, C::kRows, col0, C::kCols);
  }
}

template <class C>
cudaError_t opt_in(bool force) {
  return wgmma_opt_in<&gemm_wgmma_tma_kernel<C>, C::kSmemBytes>(force);
}

template <class C>
cudaError_t launch(const TcParams& p, cudaStream_t stream) {
  if (!p.vec_x || !p.vec_w) return cudaErrorNotSupported;
  CUtensorMap map_w, map_x;
  // Weights [batch][n][k], x [batch][m][k]: rows past n or m and k past K read as +0.
  if (!encode_bf16_map_sw128(&map_w, p.w, p.k, p.n, p.batch, p.ld_w, p.bs_w, kBK, C::kCols) ||
      !encode_bf16_map_sw128(&map_x, p.x, p.k, p.m, p.batch, p.ld_x, p.bs_x, kBK, C::kRows)) {
    return cudaErrorNotSupported;
  }
  if (const cudaError_t err = opt_in<C>(false); err != cudaSuccess) return err;
  gemm_wgmma_tma_kernel<C>
      <<<wgmma_grid<C>(p), C::kThreads, C::kSmemBytes, stream>>>(map_w, map_x, p);
  return cudaGetLastError();
}

template <class C>
constexpr WgmmaTileEntry entry(const char* name) {
  return {{name, C::kRows, C::kCols}, &launch<C>, &opt_in<C>};
}
// Name: "tma.", rows of x x output features per CTA, stages; then threads, shared memory per CTA
// and the CTAs per SM that fit. gemm_wgmma.cu keeps a cp.async tile of each rows x cols.
constexpr WgmmaTileEntry kTiles[] = {
    entry<TmaConfig<2, 8, 1, 6, 2>>("tma.8x128.s6"),      // 0: 384, 103 KiB, 2
    entry<TmaConfig<1, 8, 1, 8, 3>>("tma.8x64.s8"),       // 1: 256, 73 KiB, 3
    entry<TmaConfig<2, 16, 1, 6, 2>>("tma.16x128.s6"),    // 2: 384, 109 KiB, 2
    entry<TmaConfig<2, 32, 1, 5, 2>>("tma.32x128.s5"),    // 3: 384, 101 KiB, 2
    entry<TmaConfig<2, 64, 1, 4, 2>>("tma.64x128.s4"),    // 4: 384, 97 KiB, 2
    entry<TmaConfig<1, 64, 1, 6, 2>>("tma.64x64.s6"),     // 5: 256, 97 KiB, 2
    entry<TmaConfig<2, 128, 1, 5, 1>>("tma.128x128.s5"),  // 6: 384, 161 KiB, 1
    entry<TmaConfig<1, 128, 1, 6, 1>>("tma.128x64.s6"),   // 7: 256, 145 KiB, 1
    entry<TmaConfig<2, 128, 2, 4, 1>>("tma.256x128.s4"),  // 8: 384, 193 KiB, 1
};

}  // namespace

int wgmma_tma_tile_count() { return int(std::size(kTiles)); }

WgmmaTileInfo wgmma_tma_tile_info(int tile) {
  return tile >= 0 && tile < wgmma_tma_tile_count() ? kTiles[tile].info
                                                    : WgmmaTileInfo{"default", 0, 0};
}

cudaError_t wgmma_tma_launch(const TcParams& p, int tile, cudaStream_t stream) {
  if (tile < 0 || tile >= wgmma_tma_tile_count() || !p.nk) return cudaErrorInvalidValue;
  return kTiles[tile].launch(p, stream);
}

cudaError_t wgmma_tma_prepare() {
  for (const WgmmaTileEntry& tile : kTiles) {
    const cudaError_t err = tile.opt_in(true);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// ---- tma.cuh's host side ----

namespace {
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, looked up once through the runtime (no link to libcuda).
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

bool encode_bf16_map_sw128(CUtensorMap* map, const void* base, int64_t cols, int64_t rows,
                           int64_t batch, int64_t row_stride, int64_t batch_stride, int box_cols,
                           int box_rows) {
  const EncodeTiled encode = encoder();
  if (!encode || box_cols * 2 != kSwizzleRowBytes || cols <= 0 || rows <= 0 || batch <= 0) {
    return false;
  }
  // One batch entry: the batch stride is never stepped; any valid one (the whole matrix) serves.
  if (batch == 1) batch_stride = row_stride * rows;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(batch)};
  const cuuint64_t strides[2] = {cuuint64_t(row_stride) * 2, cuuint64_t(batch_stride) * 2};
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace dsa::cuda
