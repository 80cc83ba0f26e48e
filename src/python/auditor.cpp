#include "python/auditor.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

namespace dsa::py {
namespace pyb = pybind11;

PoolAuditor::PoolAuditor(const pyb::list& pools) {
  if (pools.empty()) throw pyb::value_error("argument 'pools' must name at least one pool");
  for (const pyb::handle item : pools) {
    const auto pair = item.cast<pyb::tuple>();
    arrays_.emplace_back(pair[1], "pools");
    const ArrayArg& a = arrays_.back();
    const PoolLayout layout = infer_pool_layout(a);
    Pool p{pair[0].cast<int>(), layout, pool_view(a, layout.kind, layout.dtype, false), {}, {}};
    if (pools_.empty()) {
      place_ = a.place();
      capacity_ = p.view.capacity();
    } else {
      a.need_place(place_, arrays_.front());
      if (p.view.capacity() != capacity_) {
        throw pyb::value_error(fmt::format(
            "argument 'pools': every pool must hold the same slots; layer {} ({}) has {} slots, "
            "the first pool {}",
            p.layer, pool_layout_label(layout), p.view.capacity(), capacity_));
      }
    }
    pools_.push_back(std::move(p));
  }
  owner_.assign(size_t(capacity_), -1);
  written_.assign(size_t(capacity_), -1);
  pos_.assign(size_t(capacity_), -1);
}

std::vector<std::string> PoolAuditor::describe_pools() const {
  std::vector<std::string> out;
  for (const Pool& p : pools_) {
    out.push_back(fmt::format("layer {}: {} ({} pages)", p.layer, pool_layout_label(p.layout),
                              p.view.num_pages));
  }
  return out;
}

void PoolAuditor::mark_dirty(int64_t pos) {
  if (dirty_lo_ >= dirty_hi_) {
    dirty_lo_ = pos;
    dirty_hi_ = pos + 1;
  } else {
    dirty_lo_ = std::min(dirty_lo_, pos);
    dirty_hi_ = std::max(dirty_hi_, pos + 1);
  }
}

void PoolAuditor::record(const std::vector<int64_t>& slots, const std::vector<int64_t>& owners,
                         int64_t step, uintptr_t stream) {
  if (slots.size() != owners.size()) {
    throw pyb::value_error(
        fmt::format("argument 'owners' needs one owner per slot: {} slots, {} "
                    "owners",
                    slots.size(), owners.size()));
  }
  std::vector<int64_t> valid, valid_owner;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    if (s == kPadSlot || (s >= 0 && s < kPageSize)) continue;  // padding and the reserved page
    if (s < 0 || s >= capacity_) {
      throw pyb::value_error(fmt::format(
          "argument 'slots': slot {} (row {}) is outside the pools' {} slots", s, i, capacity_));
    }
    if (owners[i] < 0) {
      throw pyb::value_error(
          fmt::format("argument 'owners': owner {} (row {}) must be >= 0", owners[i], i));
    }
    valid.push_back(s);
    valid_owner.push_back(owners[i]);
  }
  if (valid.empty()) return;
  const size_t n = valid.size(), np = pools_.size();
  auto backend = backend_for(place_, stream);
  int64_t* d_slots = d_slots_.reserve(*backend, place_, n);
  uint64_t* d_digests = d_digests_.reserve(*backend, place_, n * np);
  backend->copy_to_device(d_slots, valid.data(), n * sizeof(int64_t));
  for (size_t p = 0; p < np; ++p) {
    AuditSlotsParams a;
    a.slots = d_slots;
    a.digests = d_digests + p * n;
    a.pool = pools_[p].view;
    a.kind = pools_[p].layout.kind;
    a.n = int(n);
    backend->audit_slots(a);
  }
  std::vector<uint64_t> digests(n * np);
  backend->copy_to_host(digests.data(), d_digests, digests.size() * sizeof(uint64_t));
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = valid[i];
    if (owner_[s] < 0) {
      pos_[s] = int64_t(live_.size());
      live_.push_back(s);
      for (Pool& p : pools_) p.expected.push_back(0);
    }
    owner_[s] = valid_owner[i];
    written_[s] = step;
    for (size_t p = 0; p < np; ++p) pools_[p].expected[pos_[s]] = digests[p * n + i];
    mark_dirty(pos_[s]);
  }
}

void PoolAuditor::forget_at(int64_t slot) {
  if (slot < 0 || slot >= capacity_ || owner_[slot] < 0) return;
  const int64_t pos = pos_[slot], last = int64_t(live_.size()) - 1;
  if (pos != last) {
    const int64_t moved = live_[last];
    live_[pos] = moved;
    pos_[moved] = pos;
    for (Pool& p : pools_) p.expected[pos] = p.expected[last];
    mark_dirty(pos);
  }
  live_.pop_back();
  for (Pool& p : pools_) p.expected.pop_back();
  owner_[slot] = -1;
  pos_[slot] = -1;
}

void PoolAuditor::release(const std::vector<int64_t>& slots) {
  for (int64_t s : slots) forget_at(s);
}

void PoolAuditor::release_owner(int64_t owner) {
  std::vector<int64_t> theirs;
  for (int64_t s : live_) {
    if (owner_[s] == owner) theirs.push_back(s);
  }
  release(theirs);
}

std::vector<Finding> PoolAuditor::compare(Backend& backend, const int64_t* d_slots,
                                          const std::vector<const uint64_t*>& d_expected,
                                          const std::vector<int64_t>& host_slots, int64_t step) {
  const size_t n = host_slots.size(), np = pools_.size();
  int32_t* d_mismatches = d_mismatches_.reserve(backend, place_, np);
  uint64_t* d_digests = d_digests_.reserve(backend, place_, n);
  uint8_t* d_flags = d_flags_.reserve(backend, place_, n);
  backend.fill(d_mismatches, 0, np * sizeof(int32_t));
  auto params = [&](size_t p) {
    AuditSlotsParams a;
    a.slots = d_slots;
    a.digests = d_digests;
    a.expected = d_expected[p];
    a.flags = d_flags;
    a.mismatches = d_mismatches + p;
    a.pool = pools_[p].view;
    a.kind = pools_[p].layout.kind;
    a.n = int(n);
    return a;
  };
  for (size_t p = 0; p < np; ++p) backend.audit_slots(params(p));
  std::vector<int32_t> counts(np);
  backend.copy_to_host(counts.data(), d_mismatches, np * sizeof(int32_t));
  audited_ += int64_t(n);

  std::vector<Finding> findings;
  std::vector<uint8_t> flags;
  for (size_t p = 0; p < np; ++p) {
    if (counts[p] == 0) continue;
    backend.audit_slots(params(p));  // the flags buffer is shared: recompute this pool's
    flags.resize(n);
    backend.copy_to_host(flags.data(), d_flags, n);
    const char* kind = pools_[p].layout.kind == PoolKind::kIndexK ? "index_k" : "latent";
    for (size_t i = 0; i < n; ++i) {
      if (!flags[i]) continue;
      const int64_t s = host_slots[i];
      findings.emplace_back(pools_[p].layer, kind, s, owner_[s], written_[s], step);
    }
  }
  return findings;
}

std::vector<Finding> PoolAuditor::verify_all(int64_t step, uintptr_t stream) {
  const size_t n = live_.size();
  if (n == 0) return {};
  auto backend = backend_for(place_, stream);
  if (d_live_.size() < n) {
    d_live_.reserve(*backend, place_, n);
    dirty_lo_ = 0;
    dirty_hi_ = int64_t(n);
  }
  std::vector<const uint64_t*> expected;
  for (Pool& p : pools_) {
    if (p.d_expected.size() < n) {
      p.d_expected.reserve(*backend, place_, d_live_.size());
      dirty_lo_ = 0;
      dirty_hi_ = int64_t(n);
    }
    expected.push_back(p.d_expected.data());
  }
  const int64_t lo = dirty_lo_, hi = std::min<int64_t>(dirty_hi_, int64_t(n));
  if (lo < hi) {
    const size_t count = size_t(hi - lo);
    backend->copy_to_device(d_live_.data() + lo, live_.data() + lo, count * sizeof(int64_t));
    for (Pool& p : pools_) {
      backend->copy_to_device(p.d_expected.data() + lo, p.expected.data() + lo,
                              count * sizeof(uint64_t));
    }
  }
  dirty_lo_ = dirty_hi_ = 0;
  return compare(*backend, d_live_.data(), expected, live_, step);
}

std::vector<Finding> PoolAuditor::verify_positions(const std::vector<int64_t>& positions,
                                                   int64_t step, uintptr_t stream) {
  const size_t m = positions.size(), np = pools_.size();
  if (m == 0) return {};
  auto backend = backend_for(place_, stream);
  std::vector<int64_t> slots(m);
  std::vector<uint64_t> expected(m * np);
  for (size_t i = 0; i < m; ++i) {
    slots[i] = live_[positions[i]];
    for (size_t p = 0; p < np; ++p) expected[p * m + i] = pools_[p].expected[positions[i]];
  }
  int64_t* d_slots = d_slots_.reserve(*backend, place_, m);
  uint64_t* d_expected = d_listed_expected_.reserve(*backend, place_, m * np);
  backend->copy_to_device(d_slots, slots.data(), m * sizeof(int64_t));
  backend->copy_to_device(d_expected, expected.data(), expected.size() * sizeof(uint64_t));
  std::vector<const uint64_t*> per_pool;
  for (size_t p = 0; p < np; ++p) per_pool.push_back(d_expected + p * m);
  return compare(*backend, d_slots, per_pool, slots, step);
}

std::vector<Finding> PoolAuditor::verify_slots(const std::vector<int64_t>& slots, int64_t step,
                                               uintptr_t stream) {
  std::vector<int64_t> positions;
  for (int64_t s : slots) {
    if (s >= 0 && s < capacity_ && owner_[s] >= 0) positions.push_back(pos_[s]);
  }
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  return verify_positions(positions, step, stream);
}

std::vector<Finding> PoolAuditor::verify_sample(int64_t count, uint64_t seed, int64_t step,
                                                uintptr_t stream) {
  if (count < 0)
    throw pyb::value_error(fmt::format("argument 'sample' must be >= 0, got {}", count));
  const int64_t n = int64_t(live_.size());
  if (count >= n) return verify_all(step, stream);
  std::mt19937_64 rng(seed ^ (uint64_t(step) * 0x9E3779B97F4A7C15ull));
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  std::vector<int64_t> positions;
  positions.resize(size_t(count));
  for (int64_t& p : positions) p = pick(rng);
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  return verify_positions(positions, step, stream);
}

}  // namespace dsa::py
