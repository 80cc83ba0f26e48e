// Pages, slots and cache layouts: DESIGN §2 and §3. Includable from CUDA code.
//
// A slot is page * kPageSize + offset (int64). Page 0 of every pool is reserved and zero-filled;
// the allocator never hands it out. kPadSlot (-1) marks a padded row.
#pragma once

#include <cstdint>

#include "dsa/dtype.h"

namespace dsa {

inline constexpr int kPageSize = 64;         // tokens per page, every pool
inline constexpr int64_t kPadSlot = -1;      // the padding sentinel of a slot map
inline constexpr int32_t kDummyPageRow = 0;  // page-table row of the dummy request
inline constexpr int32_t kReservedPage = 0;  // never allocated, always zero

// Dimensions fixed by the cache layouts (DeepSeek-V3.2 MLA and indexer).
inline constexpr int kIndexHeadDim = 128;                  // index_head_dim
inline constexpr int kKvLoraRank = 512;                    // kv_lora_rank: the latent c
inline constexpr int kRopeDim = 64;                        // qk_rope_head_dim
inline constexpr int kLatentDim = kKvLoraRank + kRopeDim;  // 576: c ‖ k_rope
inline constexpr int kLatentTile = 128;                    // fp8 latent: one scale per 128 values
// One row's inputs to a layer's two stores, as the runner hands them out for host-side checks:
// latent c[512] ‖ k_rope[64] ‖ index key[128].
inline constexpr int kStoreValuesDim = kLatentDim + kIndexHeadDim;  // 704

enum class KvDtype : uint8_t { kBf16, kFp8 };

inline constexpr const char* kv_dtype_name(KvDtype d) {
  return d == KvDtype::kBf16 ? "bf16" : "fp8";
}

// Index-K page layouts, per layer.
//   bf16: [pages, 64, 128] bf16                      256 B/token, 16384 B/page
//   fp8:  [pages, 64*132] bytes: 64 tokens x 128 e4m3 token-major (8192 B), then 64 f32 scales
DSA_HD constexpr int64_t index_k_page_bytes(KvDtype d) {
  return d == KvDtype::kBf16 ? int64_t(kPageSize) * kIndexHeadDim * 2
                             : int64_t(kPageSize) * (kIndexHeadDim + 4);
}

// Latent-KV page layouts, per layer.
//   bf16: [pages, 64, 576] bf16                      1152 B/token
//   fp8:  [pages, 64, 656] bytes, token-major: 512 e4m3, 4 f32 scales (one per 128), 64 bf16 rope
inline constexpr int kLatentFp8TokenBytes =
    kKvLoraRank + 4 * (kKvLoraRank / kLatentTile) + 2 * kRopeDim;
static_assert(kLatentFp8TokenBytes == 656);

DSA_HD constexpr int64_t latent_token_bytes(KvDtype d) {
  return d == KvDtype::kBf16 ? int64_t(kLatentDim) * 2 : int64_t(kLatentFp8TokenBytes);
}
DSA_HD constexpr int64_t latent_page_bytes(KvDtype d) { return kPageSize * latent_token_bytes(d); }

// A non-owning view of one layer's pool, in the backend's memory.
struct PoolView {
  uint8_t* data = nullptr;  // [num_pages, page_bytes]
  KvDtype dtype = KvDtype::kBf16;
  ScaleRounding rounding = ScaleRounding::kExact;  // fp8 scale rounding (pool option)
  int64_t num_pages = 0;                           // including the reserved page 0

  DSA_HD int64_t capacity() const { return num_pages * kPageSize; }  // slots
};

// The verdict of the store contract (DESIGN §3) for one row.
enum class SlotVerdict : uint8_t {
  kWrite,          // all four rules hold
  kSkipStale,      // rule 1: r >= n_real (a stale tail); skipped silently
  kSkipPad,        // rule 2: slot == kPadSlot; skipped silently
  kSkipReserved,   // rule 3: slot in page 0; skipped silently
  kErrorRange,     // rule 4: slot >= capacity; skipped and flagged
  kErrorNegative,  // a negative slot other than kPadSlot; skipped and flagged
};

// The one definition of the store guard, shared by every writer of every backend.
DSA_HD SlotVerdict judge_slot(int64_t row, int64_t n_real, int64_t slot, int64_t capacity) {
  if (row >= n_real) return SlotVerdict::kSkipStale;
  if (slot == kPadSlot) return SlotVerdict::kSkipPad;
  if (slot < 0) return SlotVerdict::kErrorNegative;
  if (slot >= capacity) return SlotVerdict::kErrorRange;
  if (slot < kPageSize) return SlotVerdict::kSkipReserved;
  return SlotVerdict::kWrite;
}

DSA_HD bool verdict_is_error(SlotVerdict v) {
  return v == SlotVerdict::kErrorRange || v == SlotVerdict::kErrorNegative;
}

}  // namespace dsa
