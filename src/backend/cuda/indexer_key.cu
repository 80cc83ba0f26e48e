// The indexer's query path (indexer_query: RoPE -> Hadamard) and key path (indexer_key, below) in
// one launch each.
//
// The key path: LayerNorm -> RoPE (dims 0..63) -> Hadamard -> index-K
// store, a warp per token, 4 tokens per CTA. Each stage is the standalone op's arithmetic through
// the device functions those ops use, so the keys and the stored bytes are the bits of
// layernorm + rope + hadamard + store_index_k run one after another on CUDA:
//   layernorm: norm.cuh in the order of layernorm's warp mode for dim 128 (lane l owns columns
//              4l .. 4l + 3, then a warp butterfly);
//   rope:      rope.cuh's rope_pair; half-split pairs (i, i + 32) meet by a shuffle across 8 lanes,
//              interleaved pairs lie within a lane;
//   hadamard:  hadamard.cuh's warp butterflies with 4 elements per lane;
//   store:     store_index_k.cuh's judge and encoder (the one guarded writer of the layout), lanes
//              0..15 holding 8 keys each, gathered by shuffles.
// A row whose position is outside [0, max_position) is not rotated (as rope leaves it); every
// row's keys are written to k, and only the rows judge_slot allows reach the pool.
#include "backend/cuda/hadamard.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/pdl.h"
#include "backend/cuda/query_fp8.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/store_index_k.cuh"

namespace dsa::cuda {
namespace {

constexpr int kRowsPerCta = 4;
constexpr int kDim = kIndexHeadDim;  // 128: 4 values per lane
static_assert(kDim == 4 * 32 && kRopeDim == 64);

// RoPE on dims [0, 64) of a 128-wide head held 4 values a lane (lane l: dims 4l .. 4l + 3), by
// rope.cuh's rope_pair: interleaved pairs lie within a lane; half-split pairs (i, i + 32) meet by
// a shuffle across 8 lanes. Every lane of the warp must call it (rotate is the warp's).
__device__ __forceinline__ void rope_head(float (&e)[4], int lane, RopeStyle style, bool rotate,
                                          const float* angles) {
  if (style == RopeStyle::kInterleaved) {
    if (rotate && lane < kRopeDim / 4) {  // pairs 2 lane and 2 lane + 1
      rope_pair(e[0], e[1], angles[4 * lane], angles[4 * lane + 1]);
      rope_pair(e[2], e[3], angles[4 * lane + 2], angles[4 * lane + 3]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // pair i = 4 (lane % 8) + j: dims i (lanes 0..7), i + 32 (8..15)
    const float other = __shfl_xor_sync(kFullMask, e[j], 8);
    if (!rotate || lane >= kRopeDim / 4) continue;
    const int i = 4 * (lane & 7) + j;
    const bool first = lane < 8;
    float a = first ? e[j] : other, b = first ? other : e[j];
    rope_pair(a, b, angles[2 * i], angles[2 * i + 1]);
    e[j] = first ? a : b;
  }
}

// RoPE on dims [0, 64) at `position` (none outside [0, max_position), as rope), then the Hadamard
// and its scale: the indexer's rotation of one head, shared by its query and key paths.
__device__ __forceinline__ void rope_hadamard_head(float (&e)[4], int lane, RopeStyle style,
                                                   int32_t position, int max_position,
                                                   const float* cos_sin, float scale) {
  const bool rotate = position >= 0 && position < max_position;
  rope_head(e, lane, style, rotate, cos_sin + int64_t(rotate ? position : 0) * kRopeDim);
  warp_hadamard<4>(e, lane);
#pragma unroll
  for (int j = 0; j < 4; ++j) e[j] = __fmul_rn(e[j], scale);
}

__device__ __forceinline__ void load_head(const float* x, bool vec, float (&e)[4]) {
  if (vec) {
    const float4 v = *reinterpret_cast<const float4*>(x);
    e[0] = v.x, e[1] = v.y, e[2] = v.z, e[3] = v.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) e[j] = x[j];
  }
}

__device__ __forceinline__ void store_head(float* x, bool vec, const float (&e)[4]) {
  if (vec) {
    *reinterpret_cast<float4*>(x) = make_float4(e[0], e[1], e[2], e[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = e[j];
  }
}

template <KvDtype kDtype>
__global__ void __launch_bounds__(32 * kRowsPerCta)
    indexer_key_kernel(IndexerKeyParams p, StoreGuard guard, bool vec) {
  pdl_enter();
  const int64_t row = int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / 32;
  if (row >= p.batch.rows) return;  // the whole warp
  const int lane = threadIdx.x & 31, c0 = 4 * lane;

  const int32_t position = p.positions[row];  // loaded early: its latency overlaps the norm's

  // LayerNorm.
  const float4 in = norm_load4(p.x + row * p.ld_x, c0, kDim, vec);
  const float mean = __fdiv_rn(
      warp_sum(norm_add_group(0.0f, in, c0, kDim, [](float v) { return v; })), float(kDim));
  const float sq = norm_add_group(0.0f, in, c0, kDim, [mean](float v) {
    const float d = __fsub_rn(v, mean);
    return __fmul_rn(d, d);
  });
  const float inv_std = layernorm_inverse(warp_sum(sq), kDim, p.eps);
  float e[4] = {in.x, in.y, in.z, in.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    e[j] = layernorm_value(e[j], mean, inv_std, bf16_to_float(p.norm_weight[c0 + j]), p.norm_bias,
                           c0 + j);
  }

  rope_hadamard_head(e, lane, p.style, position, p.max_position, p.cos_sin, p.hadamard_scale);
  store_head(p.k + row * p.ld_k + c0, vec, e);

  // The store: lane s < 16 takes keys 8s .. 8s + 7 from lanes 2s and 2s + 1.
  float x[kIndexPerLane];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[j] = __shfl_sync(kFullMask, e[j], (2 * lane) & 31);
    x[4 + j] = __shfl_sync(kFullMask, e[j], (2 * lane + 1) & 31);
  }
  if (lane >= kIndexLanes) return;
  StoreIndexKParams store;
  store.batch = p.batch;
  store.pool = p.pool;
  const int64_t slot = index_k_judge(store, guard, row, lane);
  if (slot >= 0) index_k_write<kDtype>(p.pool, slot, lane, x);
}

// indexer_query: a warp per (row, head), 4 heads per CTA: rope_head, then the Hadamard and its
// scale; the bits of rope and hadamard run one after the other. With p.q_fp8 the warp also
// encodes the head it stored (query_fp8.cuh: the fp8 indexer kernels' own encoding of q).
__global__ void __launch_bounds__(32 * kRowsPerCta)
    indexer_query_kernel(IndexerQueryParams p, bool vec) {
  pdl_enter();
  const int64_t unit = int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / 32;
  if (unit >= int64_t(p.rows) * p.heads) return;  // the whole warp
  const int lane = threadIdx.x & 31;
  const int64_t row = unit / p.heads;
  float* q = p.q + row * p.ld_q + (unit % p.heads) * kDim + 4 * lane;
  float e[4];
  load_head(q, vec, e);
  rope_hadamard_head(e, lane, p.style, p.positions[row], p.max_position, p.cos_sin,
                     p.hadamard_scale);
  store_head(q, vec, e);
  if (p.q_fp8 != nullptr) {  // the same in every lane of the warp (encode_fp8_head shuffles)
    const int64_t head = unit % p.heads;
    uint32_t bytes;
    const float s_q = encode_fp8_head<true>(e, bytes);
    *reinterpret_cast<uint32_t*>(p.q_fp8 + row * p.ld_q_fp8 + head * kDim + 4 * lane) = bytes;
    if (lane == 0) p.q_fp8_scale[row * p.heads + head] = s_q;
  }
}

}  // namespace

cudaError_t indexer_query(const IndexerQueryParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.heads < 0 || p.ld_q < int64_t(p.heads) * kDim) return cudaErrorInvalidValue;
  const int64_t units = int64_t(p.rows) * p.heads;
  if (units == 0) return cudaSuccess;
  if (!p.q || !p.positions || !p.cos_sin) return cudaErrorInvalidValue;
  if (p.q_fp8 != nullptr &&
      (!p.q_fp8_scale || p.ld_q_fp8 < int64_t(p.heads) * kDim || p.ld_q_fp8 % 4 != 0 ||
       reinterpret_cast<uintptr_t>(p.q_fp8) % 4 != 0)) {
    return cudaErrorInvalidValue;  // the encoding is stored 4 bytes a lane
  }
  const bool vec = aligned16(p.q) && p.ld_q % 4 == 0;  // heads are 128 apart
  launch_kernel(indexer_query_kernel, ceil_div(units, kRowsPerCta), 32 * kRowsPerCta, 0, stream, p,
                vec);
  return cudaGetLastError();
}

cudaError_t indexer_key(const IndexerKeyParams& p, cudaStream_t stream) {
  const SlotBatch& b = p.batch;
  if (b.rows < 0 || p.ld_x < kDim || p.ld_k < kDim) return cudaErrorInvalidValue;
  if (b.rows == 0) return cudaSuccess;
  if (!b.slots || !b.n_real || !b.error_count || !p.x || !p.k || !p.norm_weight || !p.positions ||
      !p.cos_sin || !p.pool.data || !aligned16(p.pool.data)) {
    return cudaErrorInvalidValue;
  }
  const bool vec = aligned16(p.x) && p.ld_x % 4 == 0 && aligned16(p.k) && p.ld_k % 4 == 0;
  const unsigned blocks = ceil_div(b.rows, kRowsPerCta);
  if (p.pool.dtype == KvDtype::kBf16) {
    launch_kernel(indexer_key_kernel<KvDtype::kBf16>, blocks, 32 * kRowsPerCta, 0, stream, p,
                  p.guard, vec);
  } else {  // the fault applies to bf16 only: fp8 is always guarded (as store_index_k)
    launch_kernel(indexer_key_kernel<KvDtype::kFp8>, blocks, 32 * kRowsPerCta, 0, stream, p,
                  StoreGuard::kEnforced, vec);
  }
  return cudaGetLastError();
}

}  // namespace dsa::cuda
