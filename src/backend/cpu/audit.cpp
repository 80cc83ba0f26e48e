// The auditor's digest-and-compare, on the CPU.
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

}  // namespace dsa::cpu
