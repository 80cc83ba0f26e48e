// The byte layout of one token in each cache layout (DESIGN §3): where its bytes live in a pool,
// how values are encoded into them, and how they decode. Shared by the CPU writers, the readers
// (indexer logits, sparse MLA), the auditor and the CUDA kernels. Includable from CUDA code.
#pragma once

#include <cstdint>

#include "dsa/dtype.h"
#include "dsa/slot.h"

namespace dsa {

// ---- addressing -------------------------------------------------------------------------------

// Index-K, bf16: token (page, off) holds 128 bf16 at page * 16384 + off * 256.
// Index-K, fp8:  token (page, off) holds 128 e4m3 at page * 8448 + off * 128, and its f32 scale at
//                page * 8448 + 8192 + off * 4.
DSA_HD uint8_t* index_k_values(const PoolView& pool, int64_t slot) {
  const int64_t page = slot / kPageSize, off = slot % kPageSize;
  const int64_t elem = pool.dtype == KvDtype::kBf16 ? 2 : 1;
  return pool.data + page * index_k_page_bytes(pool.dtype) + off * kIndexHeadDim * elem;
}
DSA_HD float* index_k_scale(const PoolView& pool, int64_t slot) {  // fp8 only
  const int64_t page = slot / kPageSize, off = slot % kPageSize;
  return reinterpret_cast<float*>(pool.data + page * index_k_page_bytes(KvDtype::kFp8) +
                                  kPageSize * kIndexHeadDim + off * 4);
}

// Latent: tokens are contiguous (token-major), latent_token_bytes(dtype) each.
//   bf16: 576 bf16 (c[512] ‖ k_rope[64]).
//   fp8:  c as 512 e4m3 | 4 f32 tile scales | k_rope as 64 bf16.
DSA_HD uint8_t* latent_token(const PoolView& pool, int64_t slot) {
  return pool.data + slot * latent_token_bytes(pool.dtype);
}
inline constexpr int kLatentFp8ScaleOffset = kKvLoraRank;                                   // 512
inline constexpr int kLatentFp8RopeOffset = kKvLoraRank + 4 * (kKvLoraRank / kLatentTile);  // 528

// Every byte of a slot in a pool, for digests: the value bytes, and for fp8 index-K the scale.
// (Index-K fp8 keeps its scale apart from its values; the other layouts are one contiguous run.)
struct SlotBytes {
  const uint8_t* first;
  int64_t first_len;
  const uint8_t* second;  // null when the token is one run
  int64_t second_len;
};
DSA_HD SlotBytes index_k_slot_bytes(const PoolView& pool, int64_t slot) {
  if (pool.dtype == KvDtype::kBf16)
    return {index_k_values(pool, slot), kIndexHeadDim * 2, nullptr, 0};
  return {index_k_values(pool, slot), kIndexHeadDim,
          reinterpret_cast<const uint8_t*>(index_k_scale(pool, slot)), 4};
}
DSA_HD SlotBytes latent_slot_bytes(const PoolView& pool, int64_t slot) {
  return {latent_token(pool, slot), latent_token_bytes(pool.dtype), nullptr, 0};
}

// ---- encoding (the CPU reference; CUDA kernels produce the same bytes) --------------------------

// One fp8 group: scale = fp8_scale_for_amax(max |x|), values x / scale rounded to e4m3.
DSA_HD float encode_fp8_group(const float* x, int n, Fp8E4M3* out, ScaleRounding rounding) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    amax = a > amax ? a : amax;  // NaN never wins: it propagates through the values instead
  }
  const float scale = fp8_scale_for_amax(amax, rounding);
  for (int i = 0; i < n; ++i) out[i] = float_to_fp8(x[i] / scale);
  return scale;
}

// A token's index key as bytes: 128 bf16 into values[256], or 128 e4m3 into values[128] and its
// f32 scale into *scale. The pool writer and the digest of what a row means to write both call it.
DSA_HD void encode_index_k_bytes(KvDtype dtype, ScaleRounding rounding, const float* k /*[128]*/,
                                 uint8_t* values, float* scale) {
  if (dtype == KvDtype::kBf16) {
    Bf16* v = reinterpret_cast<Bf16*>(values);
    for (int i = 0; i < kIndexHeadDim; ++i) v[i] = float_to_bf16(k[i]);
  } else {
    *scale = encode_fp8_group(k, kIndexHeadDim, reinterpret_cast<Fp8E4M3*>(values), rounding);
  }
}

DSA_HD void encode_index_k_token(const PoolView& pool, int64_t slot, const float* k /*[128]*/) {
  encode_index_k_bytes(pool.dtype, pool.rounding, k, index_k_values(pool, slot),
                       pool.dtype == KvDtype::kFp8 ? index_k_scale(pool, slot) : nullptr);
}

// The same token from bf16 keys: the bf16 layout stores them as they are, bit for bit (NaN
// payloads included); the fp8 layout quantizes their exact f32 widening, so its bytes are those of
// the f32 writer given the widened values.
DSA_HD void encode_index_k_token(const PoolView& pool, int64_t slot, const Bf16* k /*[128]*/) {
  if (pool.dtype == KvDtype::kBf16) {
    Bf16* v = reinterpret_cast<Bf16*>(index_k_values(pool, slot));
    for (int i = 0; i < kIndexHeadDim; ++i) v[i] = k[i];
    return;
  }
  float wide[kIndexHeadDim];
  for (int i = 0; i < kIndexHeadDim; ++i) wide[i] = bf16_to_float(k[i]);
  encode_index_k_token(pool, slot, wide);
}

// A token's latent as its latent_token_bytes(dtype) contiguous bytes (layout above).
DSA_HD void encode_latent_bytes(KvDtype dtype, ScaleRounding rounding, const float* c /*[512]*/,
                                const float* k_rope /*[64]*/, uint8_t* dst) {
  if (dtype == KvDtype::kBf16) {
    Bf16* v = reinterpret_cast<Bf16*>(dst);
    for (int i = 0; i < kKvLoraRank; ++i) v[i] = float_to_bf16(c[i]);
    for (int i = 0; i < kRopeDim; ++i) v[kKvLoraRank + i] = float_to_bf16(k_rope[i]);
  } else {
    float* scales = reinterpret_cast<float*>(dst + kLatentFp8ScaleOffset);
    for (int t = 0; t < kKvLoraRank / kLatentTile; ++t) {
      scales[t] = encode_fp8_group(c + t * kLatentTile, kLatentTile,
                                   reinterpret_cast<Fp8E4M3*>(dst) + t * kLatentTile, rounding);
    }
    Bf16* rope = reinterpret_cast<Bf16*>(dst + kLatentFp8RopeOffset);
    for (int i = 0; i < kRopeDim; ++i) rope[i] = float_to_bf16(k_rope[i]);
  }
}

DSA_HD void encode_latent_token(const PoolView& pool, int64_t slot, const float* c /*[512]*/,
                                const float* k_rope /*[64]*/) {
  encode_latent_bytes(pool.dtype, pool.rounding, c, k_rope, latent_token(pool, slot));
}

// ---- decoding (dequantized f32 values) --------------------------------------------------------

// out[128] = the token's index key; fp8 values are NOT multiplied by the scale (the logit applies
// k_scale once per token, DESIGN §1.5). Returns the scale (1 for bf16).
DSA_HD float decode_index_k_token(const PoolView& pool, int64_t slot, float* out /*[128]*/) {
  const uint8_t* src = index_k_values(pool, slot);
  if (pool.dtype == KvDtype::kBf16) {
    const Bf16* v = reinterpret_cast<const Bf16*>(src);
    for (int i = 0; i < kIndexHeadDim; ++i) out[i] = bf16_to_float(v[i]);
    return 1.0f;
  }
  const Fp8E4M3* v = reinterpret_cast<const Fp8E4M3*>(src);
  for (int i = 0; i < kIndexHeadDim; ++i) out[i] = fp8_to_float(v[i]);
  return *index_k_scale(pool, slot);
}

// out[576] = c (dequantized: e4m3 * tile scale for fp8) ‖ k_rope.
DSA_HD void decode_latent_token(const PoolView& pool, int64_t slot, float* out /*[576]*/) {
  const uint8_t* src = latent_token(pool, slot);
  if (pool.dtype == KvDtype::kBf16) {
    const Bf16* v = reinterpret_cast<const Bf16*>(src);
    for (int i = 0; i < kLatentDim; ++i) out[i] = bf16_to_float(v[i]);
    return;
  }
  const Fp8E4M3* v = reinterpret_cast<const Fp8E4M3*>(src);
  const float* scales = reinterpret_cast<const float*>(src + kLatentFp8ScaleOffset);
  for (int i = 0; i < kKvLoraRank; ++i) out[i] = fp8_to_float(v[i]) * scales[i / kLatentTile];
  const Bf16* rope = reinterpret_cast<const Bf16*>(src + kLatentFp8RopeOffset);
  for (int i = 0; i < kRopeDim; ++i) out[kKvLoraRank + i] = bf16_to_float(rope[i]);
}

}  // namespace dsa
