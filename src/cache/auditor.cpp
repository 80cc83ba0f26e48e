// The slot-integrity auditor. Digests are computed, and compared, by the backend's audit_slots op
// where the cache lives. The truth of a written slot comes from the runner's write digests (what
// the row meant to write, digested on the backend); only those, and mismatch flags when a compare
// fails, cross to the host.
#include "dsa/auditor.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <random>

#include "dsa/error.h"
#include "dsa/prefix_cache.h"
#include "dsa/slot_digest.h"

namespace dsa {

std::string AuditFinding::describe() const {
  if (owner == kReservedPageOwner) {
    return fmt::format(
        "layer {} {} slot {} of the reserved page 0 changed (it must stay zero); "
        "found at step {}",
        layer, pool == PoolKind::kLatent ? "latent" : "index-K", slot, detected_step);
  }
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

SlotAuditor::SlotAuditor(Backend& backend, KvCache& cache) : backend_(backend), cache_(cache) {
  // The digest of an all-zero token in each pool's layout: what every page-0 slot must show.
  const CacheConfig& c = cache_.config();
  std::vector<uint8_t> zeros(
      size_t(std::max(latent_page_bytes(c.latent_dtype), index_k_page_bytes(c.index_k_dtype))), 0);
  const PoolView latent{zeros.data(), c.latent_dtype, c.fp8_scale_rounding, 1};
  const PoolView index_k{zeros.data(), c.index_k_dtype, c.fp8_scale_rounding, 1};
  const uint64_t zero_digest[2] = {slot_digest(latent_slot_bytes(latent, 0)),
                                   slot_digest(index_k_slot_bytes(index_k, 0))};
  page0_.resize(size_t(c.num_layers) * 2);
  for (size_t k = 0; k < page0_.size(); ++k) page0_[k].assign(kPageSize, zero_digest[k % 2]);
}

uint64_t& SlotAuditor::truth(int64_t slot, size_t pool_index) {
  if (slot < kPageSize) return page0_[pool_index][size_t(slot)];
  return entries_.at(slot).digests[pool_index];
}

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

void SlotAuditor::record_written(std::span<const int64_t> slots, std::span<const int64_t> owners,
                                 std::span<const uint64_t> digests, int64_t step) {
  const size_t pools = size_t(cache_.config().num_layers) * 2;
  require(slots.size() == owners.size() && digests.size() == pools * slots.size(),
          ErrorCode::kInvalidArgument,
          "auditor: {} slots need {} owners and {} digests, got {} and {}", slots.size(),
          slots.size(), pools * slots.size(), owners.size(), digests.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < kPageSize || slots[i] >= cache_.capacity_slots()) continue;
    Entry e{owners[i], step, std::vector<uint64_t>(pools)};
    for (size_t d = 0; d < pools; ++d) e.digests[d] = digests[d * slots.size() + i];
    entries_[slots[i]] = std::move(e);
  }
}

void SlotAuditor::accept_current(std::span<const int64_t> slots, int64_t step) {
  std::vector<int64_t> known;
  for (int64_t s : slots) {
    if ((s >= 0 && s < kPageSize) || entries_.count(s)) known.push_back(s);
  }
  std::vector<std::vector<uint64_t>> digests;
  digest_all(known, digests);
  for (size_t i = 0; i < known.size(); ++i) {
    for (size_t d = 0; d < digests.size(); ++d) truth(known[i], d) = digests[d][i];
    if (known[i] >= kPageSize) entries_.at(known[i]).step = step;
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

std::vector<AuditFinding> SlotAuditor::check(std::vector<int64_t> slots, int64_t step) {
  std::vector<AuditFinding> findings;
  std::erase_if(slots, [this](int64_t s) { return s < kPageSize || !entries_.count(s); });
  std::sort(slots.begin(), slots.end());
  slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  audited_ += int64_t(slots.size());
  for (int64_t s = 0; s < kPageSize; ++s) slots.push_back(s);  // the reserved page, always

  const size_t n = slots.size();
  DeviceArray<int64_t> d_slots(backend_, n);
  DeviceArray<uint64_t> d_digests(backend_, n), d_expected(backend_, n);
  DeviceArray<uint8_t> d_flags(backend_, n);
  DeviceArray<int32_t> d_mismatches(backend_, 1);
  backend_.copy_to_device(d_slots.data(), slots.data(), n * sizeof(int64_t));
  std::vector<uint64_t> expected(n);
  std::vector<uint8_t> flags(n);
  const int layers = cache_.config().num_layers;
  for (int l = 0; l < layers; ++l) {
    for (int k = 0; k < 2; ++k) {
      for (size_t i = 0; i < n; ++i) expected[i] = truth(slots[i], size_t(l) * 2 + k);
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
        if (slots[i] < kPageSize) {
          findings.push_back({l, p.kind, slots[i], kReservedPageOwner, -1, step, {}});
        } else {
          const Entry& e = entries_.at(slots[i]);
          findings.push_back({l, p.kind, slots[i], e.owner, e.step, step, {}});
        }
      }
    }
  }
  return findings;
}

std::vector<AuditFinding> SlotAuditor::verify_all(int64_t step) {
  std::vector<int64_t> slots;
  slots.reserve(entries_.size());
  for (const auto& kv : entries_) slots.push_back(kv.first);
  return check(std::move(slots), step);
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
  return check(std::move(slots), step);
}

}  // namespace dsa
