// The CUDA cache writers: one kernel per layout (index-K, latent), templated on the cache dtype,
// under the store contract of DESIGN §3. Every row asks judge_slot (dsa/slot.h), the same function
// the CPU writer asks, and encodes with the conversions of dsa/dtype.h, so the bytes written and
// the slots touched are identical to src/backend/cpu/store.cpp.
//
// Work split (all accesses coalesced, 16 or 8 bytes per lane):
//   index-K: 16 lanes per token, 8 values per lane; fp8 amax over the 16 lanes. The keys come as
//            float32 or as bf16 (copied bit for bit into a bf16 pool, widened exactly for fp8).
//   latent:  a warp per token, 16 values of c per lane; fp8 tile t (128 values) is lanes
//            8t..8t+7; lanes 0..7 also write the 64 rope values (8 each).
// The row count is batch.rows (a host int, fixed at capture); n_real is read on the device.
//
// fp8 encoding is the hardware conversion cvt.rn.satfinite.e4m3x2.f32 (two values an
// instruction), which gives the bits of dsa::float_to_fp8 (dtype.h is defined to match it). The
// quotient x / scale is the correctly rounded one of encode_fp8_group; see fp8_quotients.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "dsa/slot.h"
#include "dsa/token_codec.h"

namespace dsa::cuda {
namespace {

constexpr int kMaxBlock = 256;
constexpr int kIndexLanes = 16;                             // lanes per index-K token
constexpr int kIndexPerLane = kIndexHeadDim / kIndexLanes;  // 8 values
constexpr int kLatentPerLane = kKvLoraRank / 32;            // 16 values of c
constexpr int kRopePerLane = 8;                             // lanes 0..7 hold the rope
constexpr int kTileLanes = kLatentTile / kLatentPerLane;    // 8 lanes per fp8 tile

// INCIDENT REPRODUCTION (DESIGN §5), the twin of judge_incident_scatter in cpu/store.cpp: rules
// 1-3 are ignored, a negative slot wraps from the end of the pool, and one still outside the pool
// is skipped and flagged.
__device__ __forceinline__ SlotVerdict judge_incident_scatter(int64_t& slot, int64_t capacity) {
  if (slot < 0) slot += capacity;
  if (slot < 0) return SlotVerdict::kErrorNegative;
  return slot < capacity ? SlotVerdict::kWrite : SlotVerdict::kErrorRange;
}

// The e4m3 codes of lo and hi, lo in the low byte: round to nearest even, saturate to +-448
// (infinities too), NaN to 0x7F, the bits of dsa::float_to_fp8. The instruction's first source
// goes to the upper byte.
__device__ __forceinline__ uint32_t fp8x2(float lo, float hi) {
  uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
  return packed;
}

// q[i] = x[i] / scale, correctly rounded, as encode_fp8_group divides. A ue8m0 scale is a power
// of two <= 2^120 (or +inf when amax is), so 1 / scale is exact (a normal >= 2^-120, or 0) and
// x * (1 / scale) is the same correctly rounded real, NaN and signed zeros included. An exact
// scale keeps the IEEE division.
template <int kN>
__device__ __forceinline__ void fp8_quotients(float (&x)[kN], float scale, ScaleRounding rounding) {
  if (rounding == ScaleRounding::kUe8m0) {
    const float inverse = __frcp_rn(scale);
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = __fmul_rn(x[i], inverse);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = __fdiv_rn(x[i], scale);
  }
}

// Four e4m3 codes of already divided values q[0..3], low byte first.
__device__ __forceinline__ uint32_t fp8x4(const float* q) {
  return fp8x2(q[0], q[1]) | (fp8x2(q[2], q[3]) << 16);
}

// Threads per block for `rows` tokens of `lanes` threads each: small batches get one small block.
unsigned block_threads(int64_t rows, int lanes) {
  const int64_t threads = (rows * lanes + 31) / 32 * 32;
  return unsigned(threads < kMaxBlock ? threads : kMaxBlock);
}

// Eight bf16 keys as their bit patterns, two to a word, the lower index in the low half.
__device__ __forceinline__ void load_bf16x8(const Bf16* p, bool aligned, uint32_t (&w)[4]) {
  if (aligned) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = uint32_t(p[2 * i].bits) | (uint32_t(p[2 * i + 1].bits) << 16);
  }
}

// kBf16In: the keys come as bf16 (p.k_bf16): copied bit for bit into a bf16 pool, widened exactly
// to f32 for the fp8 encoding (encode_index_k_token's two overloads).
template <KvDtype kDtype, bool kBf16In>
__global__ void __launch_bounds__(kMaxBlock)
    store_index_k_kernel(StoreIndexKParams p, StoreGuard guard, bool aligned) {
  const bool incident_scatter = guard == StoreGuard::kIncidentScatter;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread / kIndexLanes;
  const int sub = int(thread % kIndexLanes);  // lane within the token's group
  if (row >= p.batch.rows) return;            // the whole group leaves together
  int64_t slot = p.batch.slots[row];
  const int64_t capacity = p.pool.capacity();
  const SlotVerdict verdict = incident_scatter ? judge_incident_scatter(slot, capacity)
                                               : judge_slot(row, *p.batch.n_real, slot, capacity);
  if (verdict != SlotVerdict::kWrite) {
    if (sub == 0 && verdict_is_error(verdict)) atomicAdd(p.batch.error_count, 1);
    return;
  }
  uint8_t* dst = index_k_values(p.pool, slot);
  if constexpr (kBf16In && kDtype == KvDtype::kBf16) {  // the bits as given
    uint32_t w[4];
    load_bf16x8(p.k_bf16 + row * p.ld_k + sub * kIndexPerLane, aligned, w);
    store16(dst + sub * kIndexPerLane * 2, w[0], w[1], w[2], w[3]);
  } else {
    float x[kIndexPerLane];
    if constexpr (kBf16In) {
      uint32_t w[4];
      load_bf16x8(p.k_bf16 + row * p.ld_k + sub * kIndexPerLane, aligned, w);
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // the exact f32 widening
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    } else {
      load_floats(p.k + row * p.ld_k + sub * kIndexPerLane, aligned, x);
    }
    if constexpr (kDtype == KvDtype::kBf16) {
      store16(dst + sub * kIndexPerLane * 2, pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
              pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
    } else {
      const unsigned mask = group_mask(threadIdx.x & 31, kIndexLanes);
      const float amax = group_max<kIndexLanes>(local_amax(x), mask);
      const float scale = fp8_scale_for_amax(amax, p.pool.rounding);
      fp8_quotients(x, scale, p.pool.rounding);
      store8(dst + sub * kIndexPerLane, fp8x4(x), fp8x4(x + 4));
      if (sub == 0) *index_k_scale(p.pool, slot) = scale;
    }
  }
}

template <KvDtype kDtype>
__global__ void __launch_bounds__(kMaxBlock)
    store_latent_kernel(StoreLatentKvParams p, bool aligned) {
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread / 32;
  const int lane = threadIdx.x & 31;
  if (row >= p.batch.rows) return;  // the whole warp leaves together
  const int64_t slot = p.batch.slots[row];
  const SlotVerdict verdict = judge_slot(row, *p.batch.n_real, slot, p.pool.capacity());
  if (verdict != SlotVerdict::kWrite) {
    if (lane == 0 && verdict_is_error(verdict)) atomicAdd(p.batch.error_count, 1);
    return;
  }
  float c[kLatentPerLane];
  load_floats(p.latent + row * p.ld_latent + lane * kLatentPerLane, aligned, c);
  float rope[kRopePerLane];
  const bool rope_lane = lane < kRopeDim / kRopePerLane;
  if (rope_lane) load_floats(p.k_rope + row * p.ld_rope + lane * kRopePerLane, aligned, rope);
  uint8_t* dst = latent_token(p.pool, slot);
  if constexpr (kDtype == KvDtype::kBf16) {
    uint8_t* mine = dst + lane * kLatentPerLane * 2;
    store16(mine, pack_bf16x2(c[0], c[1]), pack_bf16x2(c[2], c[3]), pack_bf16x2(c[4], c[5]),
            pack_bf16x2(c[6], c[7]));
    store16(mine + 16, pack_bf16x2(c[8], c[9]), pack_bf16x2(c[10], c[11]),
            pack_bf16x2(c[12], c[13]), pack_bf16x2(c[14], c[15]));
    if (rope_lane) {
      store16(dst + kKvLoraRank * 2 + lane * kRopePerLane * 2, pack_bf16x2(rope[0], rope[1]),
              pack_bf16x2(rope[2], rope[3]), pack_bf16x2(rope[4], rope[5]),
              pack_bf16x2(rope[6], rope[7]));
    }
  } else {
    const float amax = group_max<kTileLanes>(local_amax(c), group_mask(lane, kTileLanes));
    const float scale = fp8_scale_for_amax(amax, p.pool.rounding);
    fp8_quotients(c, scale, p.pool.rounding);
    store16(dst + lane * kLatentPerLane, fp8x4(c), fp8x4(c + 4), fp8x4(c + 8), fp8x4(c + 12));
    if (lane % kTileLanes == 0) {
      reinterpret_cast<float*>(dst + kLatentFp8ScaleOffset)[lane / kTileLanes] = scale;
    }
    if (rope_lane) {
      store16(dst + kLatentFp8RopeOffset + lane * kRopePerLane * 2, pack_bf16x2(rope[0], rope[1]),
              pack_bf16x2(rope[2], rope[3]), pack_bf16x2(rope[4], rope[5]),
              pack_bf16x2(rope[6], rope[7]));
    }
  }
}

bool batch_ok(const SlotBatch& b) {
  return b.rows >= 0 && (b.rows == 0 || (b.slots && b.n_real && b.error_count));
}

template <bool kBf16In>
void launch_store_index_k(const StoreIndexKParams& p, bool aligned, cudaStream_t stream) {
  const unsigned threads = block_threads(p.batch.rows, kIndexLanes);
  const unsigned blocks = ceil_div(int64_t(p.batch.rows) * kIndexLanes, threads);
  if (p.pool.dtype == KvDtype::kBf16) {
    store_index_k_kernel<KvDtype::kBf16, kBf16In>
        <<<blocks, threads, 0, stream>>>(p, p.guard, aligned);
  } else {  // the fault applies to bf16 only: fp8 is always guarded
    store_index_k_kernel<KvDtype::kFp8, kBf16In>
        <<<blocks, threads, 0, stream>>>(p, StoreGuard::kEnforced, aligned);
  }
}

}  // namespace

cudaError_t store_index_k(const StoreIndexKParams& p, cudaStream_t stream) {
  if (!batch_ok(p.batch) || p.ld_k < kIndexHeadDim) return cudaErrorInvalidValue;
  if (p.batch.rows == 0) return cudaSuccess;
  const bool bf16_in = p.k_bf16 != nullptr;
  if (bf16_in == (p.k != nullptr) || !p.pool.data || !aligned16(p.pool.data)) {
    return cudaErrorInvalidValue;  // exactly one of k and k_bf16
  }
  if (bf16_in) {
    launch_store_index_k<true>(p, aligned16(p.k_bf16) && p.ld_k % 8 == 0, stream);
  } else {
    launch_store_index_k<false>(p, aligned16(p.k) && p.ld_k % 4 == 0, stream);
  }
  return cudaGetLastError();
}

cudaError_t store_latent_kv(const StoreLatentKvParams& p, cudaStream_t stream) {
  if (!batch_ok(p.batch) || p.ld_latent < kKvLoraRank || p.ld_rope < kRopeDim) {
    return cudaErrorInvalidValue;
  }
  if (p.batch.rows == 0) return cudaSuccess;
  if (!p.latent || !p.k_rope || !p.pool.data || !aligned16(p.pool.data)) {
    return cudaErrorInvalidValue;
  }
  const bool aligned =
      aligned16(p.latent) && aligned16(p.k_rope) && p.ld_latent % 4 == 0 && p.ld_rope % 4 == 0;
  const unsigned threads = block_threads(p.batch.rows, 32);
  const unsigned blocks = ceil_div(int64_t(p.batch.rows) * 32, threads);
  if (p.pool.dtype == KvDtype::kBf16) {
    store_latent_kernel<KvDtype::kBf16><<<blocks, threads, 0, stream>>>(p, aligned);
  } else {
    store_latent_kernel<KvDtype::kFp8><<<blocks, threads, 0, stream>>>(p, aligned);
  }
  return cudaGetLastError();
}

}  // namespace dsa::cuda
