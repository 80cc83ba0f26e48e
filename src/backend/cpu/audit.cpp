// The auditor's digest-and-compare, and the digests of what a step's rows mean to write, on the
// CPU.
#include "backend/cpu/cpu_ops.h"
#include "dsa/slot_digest.h"

namespace dsa::cpu {

void audit_slots(const AuditSlotsParams& p) {
  int32_t flagged = 0;
  for (int i = 0; i < p.n; ++i) {
    const SlotBytes bytes = p.kind == PoolKind::kLatent ? latent_slot_bytes(p.pool, p.slots[i])
                                                        : index_k_slot_bytes(p.pool, p.slots[i]);
    p.digests[i] = slot_digest(bytes);
    if (p.expected) {
      p.flags[i] = p.digests[i] != p.expected[i];
      flagged += p.flags[i];
    }
  }
  if (p.expected) *p.mismatches += flagged;
}

void digest_rows(const DigestRowsParams& p) {
  const int64_t n_real = p.rows > 0 ? *p.n_real : 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    if (r >= n_real) {
      p.digests[r] = 0;
      continue;
    }
    const float* v = p.values + r * p.ld_values;
    p.digests[r] = p.kind == PoolKind::kIndexK
                       ? index_k_values_digest(p.dtype, p.rounding, v)
                       : latent_values_digest(p.dtype, p.rounding, v, p.k_rope + r * p.ld_rope);
  }
}

void audit_sample(const AuditSampleParams& p) {
  if (p.sample <= 0) return;
  AuditSampleRecord& f = *p.findings;
  const int64_t step = p.step >= 0 ? p.step : f.next_step;
  const int64_t n = *p.live_count, count = p.sample;
  const bool every = count >= n;  // the whole set: position i for i < n
  const uint64_t start = audit_sample_start(p.seed, step);
  const int64_t width = every ? 1 : n / count, wider = every ? 0 : n % count;
  for (int pool = 0; pool < p.n_pools; ++pool) {
    const AuditPool& a = p.pools[pool];
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pos = every ? (i < n ? i : -1) : audit_sample_position(start, i, width, wider);
      if (p.drawn && pool == 0) p.drawn[i] = pos;
      if (pos < 0) continue;
      const int64_t slot = p.live[pos];
      const SlotBytes bytes = a.kind == PoolKind::kLatent ? latent_slot_bytes(a.view, slot)
                                                          : index_k_slot_bytes(a.view, slot);
      if (slot_digest(bytes) == a.expected[pos]) continue;
      ++f.mismatches;
      const uint32_t at = f.kept++;
      if (at < uint32_t(kSampledMismatchesKept)) f.first[at] = {slot, step, pool, 0};
    }
  }
  ++f.verifies;
  f.next_step = step + 1;
}

}  // namespace dsa::cpu
