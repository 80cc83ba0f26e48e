// The shadow oracle: an independent witness for the slot-integrity auditor in fault-injection
// runs (DESIGN §6). It keeps a host copy of the bytes every live slot should hold, encoded on the
// host with the token codec from the values the real rows gave the stores, and after each step
// compares them byte for byte with the pools read back whole. It shares nothing with the auditor
// but the layouts: no digest, no backend op, no truth read back from a pool after a write.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "dsa/auditor.h"
#include "dsa/cache.h"
#include "dsa/ops.h"

namespace dsa {

// A live slot (or a slot of the reserved page 0) whose bytes are not what its owner wrote.
struct Clobber {
  int layer = 0;
  PoolKind pool = PoolKind::kLatent;
  int64_t slot = 0;
  int64_t owner = -1;  // -1 for page 0
  int64_t step = -1;   // the compare that saw it
};

class ShadowOracle {
 public:
  ShadowOracle(Backend& backend, const KvCache& cache);

  // The real rows of a step wrote slots[i] for owners[i] with the values
  // values[(layer * slots.size() + i) * kStoreValuesDim + ...] (c ‖ k_rope ‖ index key).
  // Slots outside [64, capacity) are ignored: no store writes them.
  void write(std::span<const int64_t> slots, std::span<const int64_t> owners,
             std::span<const float> values);
  void forget(std::span<const int64_t> slots);  // released by their owner

  // Reads every pool back and returns each live slot, and each slot of page 0 (which must stay
  // zero), whose bytes differ from the shadow. The shadow then takes the pool's bytes, so one
  // change is reported once.
  std::vector<Clobber> compare(int64_t step);
  size_t live() const { return live_.size() - kPageSize; }

 private:
  // A slot's expected bytes, per layer: the latent token, then the index-K values and (fp8) scale.
  struct Shadow {
    int64_t owner;
    std::vector<uint8_t> bytes;
  };
  int64_t latent_bytes() const;
  int64_t index_k_bytes() const;

  Backend& backend_;
  const KvCache& cache_;
  std::map<int64_t, Shadow> live_;  // slot -> expected bytes; page 0's slots always present
};

// The auditor's recall against the oracle. A clobber counts as found when the auditor reports
// the same layer, pool and slot in the same step or later, while the slot is still live (its
// scope may look later than the oracle; a slot's last audit is at its release). A finding with no
// clobber behind it is unconfirmed.
class RecallTally {
 public:
  void saw_clobbers(std::span<const Clobber> clobbers);  // call before the same step's findings
  void saw_findings(std::span<const AuditFinding> findings);
  void released(std::span<const int64_t> slots);  // their unmatched clobbers stay missed

  int64_t oracle_clobbers() const { return clobbers_; }
  int64_t auditor_found() const { return found_; }
  int64_t auditor_unconfirmed() const { return unconfirmed_; }

 private:
  std::map<std::pair<int64_t, int>, int64_t> unmatched_;  // (slot, layer * 2 + pool) -> clobbers
  int64_t clobbers_ = 0, found_ = 0, unconfirmed_ = 0;
};

}  // namespace dsa
