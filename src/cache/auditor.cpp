// The slot-integrity auditor. Digests are computed, and compared, by the backend's audit_slots op
// where the cache lives; only digests of newly written slots, and mismatch flags when a compare
// fails, cross to the host.
#include "dsa/auditor.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <random>

#include "dsa/error.h"
#include "dsa/prefix_cache.h"

namespace dsa {

std::string AuditFinding::describe() const {
  const std::string who = owner == kPrefixCacheOwner
                              ? fmt::format("cached (shared by {} requests: {})", sharers.size(),
                                            fmt::join(sharers, ", "))
                              : fmt::format("owned by request {}", owner);
  return fmt::format(
      "layer {} {} slot {} (page {}, offset {}) {} since step {} changed; found at "
      "step {}",
      layer, pool == PoolKind::kLatent ? "latent" : "index-K", slot, slot / kPageSize,
      slot % kPageSize, who, written_step, detected_step);
}

SlotAuditor::SlotAuditor(Backend& backend, KvCache& cache) : backend_(backend), cache_(cache) {}

void SlotAuditor::digest_all(const std::vector<int64_t>& slots,
                             std::vector<std::vector<uint64_t>>& out) {
  const int layers = cache_.config().num_layers;
  out.assign(size_t(layers) * 2, std::vector<uint64_t>(slots.size()));
  if (slots.empty()) return;
  DeviceArray<int64_t> d_slots(backend_, slots.size());
  DeviceArray<uint64_t> d_digests(backend_, slots.size());
  backend_.copy_to_device(d_slots.data(), slots.data(), slots.size() * sizeof(int64_t));
  for (int l = 0; l < layers; ++l) {
    for (int k = 0; k < 2; ++k) {
      AuditSlotsParams p;
      p.slots = d_slots.data();
      p.digests = d_digests.data();
      p.pool = k == 0 ? cache_.latent(l) : cache_.index_k(l);
      p.kind = k == 0 ? PoolKind::kLatent : PoolKind::kIndexK;
      p.n = int(slots.size());
      backend_.audit_slots(p);
      backend_.copy_to_host(out[size_t(l) * 2 + k].data(), d_digests.data(),
                            slots.size() * sizeof(uint64_t));
    }
  }
}

void SlotAuditor::record(std::span<const int64_t> slots, std::span<const int64_t> owners,
                         int64_t step) {
  require(slots.size() == owners.size(), ErrorCode::kInvalidArgument,
          "auditor: {} slots but {} owners", slots.size(), owners.size());
  std::vector<int64_t> valid;
  std::vector<int64_t> valid_owner;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] >= kPageSize && slots[i] < cache_.capacity_slots()) {
      valid.push_back(slots[i]);
      valid_owner.push_back(owners[i]);
    }
  }
  std::vector<std::vector<uint64_t>> digests;
  digest_all(valid, digests);
  for (size_t i = 0; i < valid.size(); ++i) {
    Entry e{valid_owner[i], step, std::vector<uint64_t>(digests.size())};
    for (size_t d = 0; d < digests.size(); ++d) e.digests[d] = digests[d][i];
    entries_[valid[i]] = std::move(e);
  }
}

void SlotAuditor::forget(std::span<const int64_t> slots) {
  for (int64_t s : slots) entries_.erase(s);
}

void SlotAuditor::adopt(std::span<const int64_t> slots, int64_t owner) {
  for (int64_t s : slots) {
    auto it = entries_.find(s);
    if (it != entries_.end()) it->second.owner = owner;
  }
}

void SlotAuditor::forget_owner(int64_t owner) {
  std::erase_if(entries_, [owner](const auto& kv) { return kv.second.owner == owner; });
}

std::vector<AuditFinding> SlotAuditor::check(const std::vector<int64_t>& slots, int64_t step) {
  std::vector<AuditFinding> findings;
  std::vector<int64_t> watched;
  for (int64_t s : slots) {
    if (entries_.count(s)) watched.push_back(s);
  }
  if (watched.empty()) return findings;
  std::sort(watched.begin(), watched.end());
  watched.erase(std::unique(watched.begin(), watched.end()), watched.end());
  audited_ += int64_t(watched.size());

  const size_t n = watched.size();
  DeviceArray<int64_t> d_slots(backend_, n);
  DeviceArray<uint64_t> d_digests(backend_, n), d_expected(backend_, n);
  DeviceArray<uint8_t> d_flags(backend_, n);
  DeviceArray<int32_t> d_mismatches(backend_, 1);
  backend_.copy_to_device(d_slots.data(), watched.data(), n * sizeof(int64_t));
  std::vector<uint64_t> expected(n);
  std::vector<uint8_t> flags(n);
  const int layers = cache_.config().num_layers;
  for (int l = 0; l < layers; ++l) {
    for (int k = 0; k < 2; ++k) {
      for (size_t i = 0; i < n; ++i) expected[i] = entries_.at(watched[i]).digests[l * 2 + k];
      backend_.copy_to_device(d_expected.data(), expected.data(), n * sizeof(uint64_t));
      backend_.fill(d_mismatches.data(), 0, sizeof(int32_t));
      AuditSlotsParams p;
      p.slots = d_slots.data();
      p.digests = d_digests.data();
      p.expected = d_expected.data();
      p.flags = d_flags.data();
      p.mismatches = d_mismatches.data();
      p.pool = k == 0 ? cache_.latent(l) : cache_.index_k(l);
      p.kind = k == 0 ? PoolKind::kLatent : PoolKind::kIndexK;
      p.n = int(n);
      backend_.audit_slots(p);
      int32_t bad = 0;
      backend_.copy_to_host(&bad, d_mismatches.data(), sizeof(int32_t));
      if (bad == 0) continue;
      backend_.copy_to_host(flags.data(), d_flags.data(), n);
      for (size_t i = 0; i < n; ++i) {
        if (!flags[i]) continue;
        const Entry& e = entries_.at(watched[i]);
        findings.push_back({l, p.kind, watched[i], e.owner, e.step, step, {}});
      }
    }
  }
  return findings;
}

std::vector<AuditFinding> SlotAuditor::verify_all(int64_t step) {
  std::vector<int64_t> slots;
  slots.reserve(entries_.size());
  for (const auto& kv : entries_) slots.push_back(kv.first);
  return check(slots, step);
}

std::vector<AuditFinding> SlotAuditor::verify(std::span<const int64_t> slots, int64_t step) {
  return check(std::vector<int64_t>(slots.begin(), slots.end()), step);
}

std::vector<AuditFinding> SlotAuditor::verify_sample(int sample, uint64_t seed, int64_t step) {
  std::vector<int64_t> slots;
  for (const auto& kv : entries_) slots.push_back(kv.first);
  std::sort(slots.begin(), slots.end());  // the sample depends on the seed, not on hash order
  std::mt19937_64 rng(seed ^ uint64_t(step));
  std::shuffle(slots.begin(), slots.end(), rng);
  if (int(slots.size()) > sample) slots.resize(std::max(sample, 0));
  return check(slots, step);
}

}  // namespace dsa
