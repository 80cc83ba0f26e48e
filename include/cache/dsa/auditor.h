// The slot-integrity auditor (DESIGN §6): remembers the digest of every slot a real row wrote, per
// layer and pool, and later recomputes digests on the backend to find slots that changed behind
// their owner's back.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsa/cache.h"
#include "dsa/ops.h"

namespace dsa {

struct AuditFinding {
  int layer = 0;
  PoolKind pool = PoolKind::kLatent;
  int64_t slot = 0;
  int64_t owner = -1;          // the request that wrote the slot (kPrefixCacheOwner: cached)
  int64_t written_step = -1;   // when the owner wrote it
  int64_t detected_step = -1;  // the audit that found the change
  // A cached page's slot: every request (or session) that shared the page when the change was
  // found; the engine fills it in. Empty for a slot with a single owner.
  std::vector<int64_t> sharers;
  std::string describe() const;
};

enum class AuditScope : uint8_t { kAll, kListed, kSample };

class SlotAuditor {
 public:
  SlotAuditor(Backend& backend, KvCache& cache);

  // After a step: the slots its real rows wrote, with their owners. Their digests are computed on
  // the backend now and remembered as the truth.
  void record(std::span<const int64_t> slots, std::span<const int64_t> owners, int64_t step);
  // The owner released these slots (finished, aborted, preempted): stop watching them.
  void forget(std::span<const int64_t> slots);
  void forget_owner(int64_t owner);
  // Watched slots change owner, keeping the digests recorded when they were written: a page the
  // prefix cache takes over (owner kPrefixCacheOwner) is checked against its writer's truth.
  void adopt(std::span<const int64_t> slots, int64_t owner);
  bool watches(int64_t slot) const { return entries_.count(slot) != 0; }

  // Recomputes digests of the watched slots (all of them, those listed, or a seeded sample of
  // `sample` of them) on the backend and returns every mismatch.
  std::vector<AuditFinding> verify_all(int64_t step);
  std::vector<AuditFinding> verify(std::span<const int64_t> slots, int64_t step);
  std::vector<AuditFinding> verify_sample(int sample, uint64_t seed, int64_t step);

  size_t watched() const { return entries_.size(); }
  int64_t audited_slots() const { return audited_; }

 private:
  struct Entry {
    int64_t owner;
    int64_t step;
    std::vector<uint64_t> digests;  // [layers * 2]: latent then index-K per layer
  };
  std::vector<AuditFinding> check(const std::vector<int64_t>& slots, int64_t step);
  // digests[layer * 2 + pool][i] for slots[i]; with expected, only mismatch flags come back.
  void digest_all(const std::vector<int64_t>& slots, std::vector<std::vector<uint64_t>>& out);

  Backend& backend_;
  KvCache& cache_;
  std::unordered_map<int64_t, Entry> entries_;  // watched slot -> truth
  int64_t audited_ = 0;
};

}  // namespace dsa
