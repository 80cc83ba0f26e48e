// The index-K writer's device half, shared by store.cu and the kernels that end in an index-K
// store (indexer_key.cu): one judge of a row's slot and one encoder, so the store contract has one
// guarded writer whatever kernel calls it. A token is written by 16 lanes (an aligned half-warp or
// group of 16 threads), lane `sub` holding keys 8 sub .. 8 sub + 7.
//
// fp8 encoding is the hardware conversion cvt.rn.satfinite.e4m3x2.f32 (two values an
// instruction), which gives the bits of dsa::float_to_fp8 (dtype.h is defined to match it). The
// quotient x / scale is the correctly rounded one of encode_fp8_group; see fp8_quotients.
#pragma once

#include "backend/cuda/common.cuh"
#include "dsa/ops.h"
#include "dsa/slot.h"
#include "dsa/token_codec.h"

namespace dsa::cuda {

inline constexpr int kIndexLanes = 16;                             // lanes per index-K token
inline constexpr int kIndexPerLane = kIndexHeadDim / kIndexLanes;  // 8 values

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

// The slot row `row` of an index-K store may write, by judge_slot (or the incident's scatter when
// `guard` asks for it): the slot, or -1 when the row writes nothing. Lane sub == 0 adds the row's
// error, if any, to the step's flag. Every lane of the row's group gets the same answer.
__device__ __forceinline__ int64_t index_k_judge(const StoreIndexKParams& p, StoreGuard guard,
                                                 int64_t row, int sub) {
  int64_t slot = p.batch.slots[row];
  const int64_t capacity = p.pool.capacity();
  const SlotVerdict verdict = guard == StoreGuard::kIncidentScatter
                                  ? judge_incident_scatter(slot, capacity)
                                  : judge_slot(row, *p.batch.n_real, slot, capacity);
  if (verdict != SlotVerdict::kWrite) {
    if (sub == 0 && verdict_is_error(verdict)) atomicAdd(p.batch.error_count, 1);
    return -1;
  }
  return slot;
}

// Encodes f32 keys into the token at `slot` (judged by index_k_judge): bf16, or fp8 with the
// token's scale from the amax over the 16 lanes. All 16 lanes of the token call it.
template <KvDtype kDtype>
__device__ __forceinline__ void index_k_write(const PoolView& pool, int64_t slot, int sub,
                                              float (&x)[kIndexPerLane]) {
  uint8_t* dst = index_k_values(pool, slot);
  if constexpr (kDtype == KvDtype::kBf16) {
    store16(dst + sub * kIndexPerLane * 2, pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
            pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
  } else {
    const unsigned mask = group_mask(threadIdx.x & 31, kIndexLanes);
    const float amax = group_max<kIndexLanes>(local_amax(x), mask);
    const float scale = fp8_scale_for_amax(amax, pool.rounding);
    fp8_quotients(x, scale, pool.rounding);
    store8(dst + sub * kIndexPerLane, fp8x4(x), fp8x4(x + 4));
    if (sub == 0) *index_k_scale(pool, slot) = scale;
  }
}

}  // namespace dsa::cuda
