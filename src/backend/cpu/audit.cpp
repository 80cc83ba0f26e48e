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

}  // namespace dsa::cpu
