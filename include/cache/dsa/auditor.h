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

  // After a step: the slots its real rows wrote, their owners, and what each row meant to write:
  // digests[(layer * 2 + pool) * slots.size() + i] for slots[i], pool 0 latent and 1 index-K (the
  // runner's write digests, computed on the backend from the store inputs). That is the slots'
  // truth from now on; the pool is not read, so a write that clobbers the slot in the same step is
  // a finding too. Slots outside [64, capacity) are ignored (the stores never write them).
  void record_written(std::span<const int64_t> slots, std::span<const int64_t> owners,
                      std::span<const uint64_t> digests, int64_t step);
  // After a finding: the slots' current bytes become their truth, so each change is reported once.
  // (Page-0 slots too: a second change of the reserved page is a second finding.)
  void accept_current(std::span<const int64_t> slots, int64_t step);
  // The owner released these slots (finished, aborted, preempted): stop watching them.
  void forget(std::span<const int64_t> slots);
  void forget_owner(int64_t owner);
  // Watched slots change owner, keeping the digests recorded when they were written: a page the
  // prefix cache takes over (owner kPrefixCacheOwner) is checked against its writer's truth.
  void adopt(std::span<const int64_t> slots, int64_t owner);
  bool watches(int64_t slot) const { return entries_.count(slot) != 0; }

  // Recomputes digests of the watched slots (all of them, those listed, or a seeded sample of
  // `sample` of them) on the backend and returns every mismatch. Every verification also checks
  // page 0 of every pool, which must stay zero: a change there is a finding with owner -1.
  std::vector<AuditFinding> verify_all(int64_t step);
  std::vector<AuditFinding> verify(std::span<const int64_t> slots, int64_t step);
  std::vector<AuditFinding> verify_sample(int sample, uint64_t seed, int64_t step);

  size_t watched() const { return entries_.size(); }  // page 0 not counted
  int64_t audited_slots() const { return audited_; }

 private:
  struct Entry {
    int64_t owner;
    int64_t step;
    std::vector<uint64_t> digests;  // [layers * 2]: latent then index-K per layer
  };
  std::vector<AuditFinding> check(std::vector<int64_t> slots, int64_t step);
  // digests[layer * 2 + pool][i] of the current bytes of slots[i].
  void digest_all(const std::vector<int64_t>& slots, std::vector<std::vector<uint64_t>>& out);
  uint64_t& truth(int64_t slot, size_t pool_index);  // an entry's, or page 0's

  Backend& backend_;
  KvCache& cache_;
  std::unordered_map<int64_t, Entry> entries_;  // watched slot -> truth
  std::vector<std::vector<uint64_t>> page0_;    // [layers * 2][64]: zero bytes' digests at first
  int64_t audited_ = 0;
};

// A slot's owner in a finding on the reserved page, which nobody owns.
inline constexpr int64_t kReservedPageOwner = -1;

}  // namespace dsa
