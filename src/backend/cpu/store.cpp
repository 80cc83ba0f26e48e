// The CPU cache writers: one per layout, parameterised by dtype, under the store contract of
// DESIGN §3. Each is a single row loop over the slot map that asks judge_slot (dsa/slot.h) for
// every row and encodes with the token codec (cache/token_codec.h), so the CUDA kernels, which
// use the same two functions, write the same bytes to the same slots.
#include <cstdint>

#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"
#include "dsa/slot.h"
#include "dsa/token_codec.h"

namespace dsa::cpu {
namespace {

void check_batch(const SlotBatch& batch, const char* op) {
  require(batch.rows >= 0, ErrorCode::kInvalidArgument, "{}: batch.rows is {}, must be >= 0", op,
          batch.rows);
  if (batch.rows == 0) return;
  require(batch.slots != nullptr && batch.n_real != nullptr && batch.error_count != nullptr,
          ErrorCode::kInvalidArgument, "{}: slot map, n_real and error_count must all be set", op);
}

// INCIDENT REPRODUCTION (DESIGN §5, fault `unguarded-store`), never the normal path. This is what
// the framework scatter `pool.view(-1, 128)[slots] = k` of the incident does: it knows nothing of
// rules 1-3, so stale-tail rows, -1 pads and page-0 slots are all written, and a negative slot
// indexes from the end of the pool as in Python (-1 is the pool's last slot). An index still
// outside [0, capacity) after wrapping would fault the framework; here it is skipped and flagged.
SlotVerdict judge_incident_scatter(int64_t& slot, int64_t capacity) {
  if (slot < 0) slot += capacity;  // cannot overflow: capacity >= 0
  if (slot < 0) return SlotVerdict::kErrorNegative;
  return slot < capacity ? SlotVerdict::kWrite : SlotVerdict::kErrorRange;
}

}  // namespace

void store_index_k(const StoreIndexKParams& p) {
  check_batch(p.batch, "store_index_k");
  if (p.batch.rows == 0) return;
  require(p.ld_k >= kIndexHeadDim, ErrorCode::kInvalidArgument,
          "store_index_k: ld_k is {}, must be >= {}", p.ld_k, kIndexHeadDim);
  require((p.k == nullptr) != (p.k_bf16 == nullptr), ErrorCode::kInvalidArgument,
          "store_index_k: exactly one of k (float32) and k_bf16 must be set");
  // The fault applies to the bf16 layout only: fp8 uses the guarded writer even when it is on.
  const bool incident_scatter =
      p.guard == StoreGuard::kIncidentScatter && p.pool.dtype == KvDtype::kBf16;
  const int64_t n_real = *p.batch.n_real;
  const int64_t capacity = p.pool.capacity();
  for (int64_t r = 0; r < p.batch.rows; ++r) {
    int64_t slot = p.batch.slots[r];
    const SlotVerdict verdict = incident_scatter ? judge_incident_scatter(slot, capacity)
                                                 : judge_slot(r, n_real, slot, capacity);
    if (verdict == SlotVerdict::kWrite) {
      if (p.k_bf16 != nullptr) {
        encode_index_k_token(p.pool, slot, p.k_bf16 + r * p.ld_k);
      } else {
        encode_index_k_token(p.pool, slot, p.k + r * p.ld_k);
      }
    } else if (verdict_is_error(verdict)) {
      ++*p.batch.error_count;
    }
  }
}

void store_latent_kv(const StoreLatentKvParams& p) {
  check_batch(p.batch, "store_latent_kv");
  if (p.batch.rows == 0) return;
  require(p.ld_latent >= kKvLoraRank && p.ld_rope >= kRopeDim, ErrorCode::kInvalidArgument,
          "store_latent_kv: ld_latent {} and ld_rope {} must be >= {} and {}", p.ld_latent,
          p.ld_rope, kKvLoraRank, kRopeDim);
  const int64_t n_real = *p.batch.n_real;
  const int64_t capacity = p.pool.capacity();
  for (int64_t r = 0; r < p.batch.rows; ++r) {
    const int64_t slot = p.batch.slots[r];
    const SlotVerdict verdict = judge_slot(r, n_real, slot, capacity);
    if (verdict == SlotVerdict::kWrite) {
      encode_latent_token(p.pool, slot, p.latent + r * p.ld_latent, p.k_rope + r * p.ld_rope);
    } else if (verdict_is_error(verdict)) {
      ++*p.batch.error_count;
    }
  }
}

}  // namespace dsa::cpu
