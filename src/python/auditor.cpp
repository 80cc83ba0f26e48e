#include "python/auditor.h"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>

#include "dsa/slot_digest.h"

namespace dsa::py {
namespace pyb = pybind11;

namespace {

// Integers the auditor reads on the host: in place from a contiguous int64 array on the CPU,
// converted (no Python ints) from an int32 or strided one, copied down from a CUDA array once, or
// cast from a Python int or sequence.
class HostInt64s {
 public:
  HostInt64s(const pyb::object& obj, const char* name,
             std::optional<uintptr_t> stream = std::nullopt) {
    if (pyb::isinstance<pyb::int_>(obj) && !pyb::isinstance<pyb::bool_>(obj)) {
      owned_.push_back(obj.cast<int64_t>());
    } else if (pyb::isinstance<pyb::list>(obj) || pyb::isinstance<pyb::tuple>(obj)) {
      try {
        owned_ = obj.cast<std::vector<int64_t>>();
      } catch (const pyb::cast_error&) {
        throw pyb::type_error(fmt::format("argument '{}' must hold ints", name));
      }
    } else {
      read_array(obj, name, stream);
    }
    if (view_.empty()) view_ = owned_;
  }
  std::span<const int64_t> get() const { return view_; }
  size_t size() const { return view_.size(); }
  int64_t operator[](size_t i) const { return view_[i]; }

 private:
  void read_array(const pyb::object& obj, const char* name, std::optional<uintptr_t> stream) {
    const ArrayArg a(obj, name);
    a.need_dtype({Dtype::kI64, Dtype::kI32}, "(slots and owners are integers)");
    const auto n = size_t(a.numel());
    bool contiguous = true;
    int64_t expect = 1;
    for (int i = a.ndim() - 1; i >= 0; --i) {
      contiguous = contiguous && (a.dim(i) == 1 || a.stride(i) == expect);
      expect *= a.dim(i);
    }
    if (!contiguous && a.ndim() != 1) {
      throw pyb::value_error(fmt::format(
          "argument '{}' must be C-contiguous or one-dimensional, got {}", name, a.describe()));
    }
    const int64_t step = contiguous ? 1 : a.stride(0);
    const size_t width = a.dtype() == Dtype::kI64 ? 8 : 4;
    const auto* bytes = static_cast<const uint8_t*>(a.data());
    std::vector<uint8_t> host;
    if (a.place().cuda()) {  // one copy of the span the elements occupy
      const size_t span = n == 0 ? 0 : ((n - 1) * size_t(std::abs(step)) + 1) * width;
      host.resize(span);
      const uint8_t* first = step < 0 ? bytes + (int64_t(n) - 1) * step * int64_t(width) : bytes;
      backend_for(a.place(), caller_stream(stream, a.place()))
          ->copy_to_host(host.data(), first, span);
      bytes = step < 0 ? host.data() + span - width : host.data();
    } else if (contiguous && width == 8) {
      view_ = {reinterpret_cast<const int64_t*>(bytes), n};
      return;
    }
    owned_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* at = bytes + int64_t(i) * step * int64_t(width);
      if (width == 8) {
        std::memcpy(&owned_[i], at, 8);
      } else {
        int32_t v;
        std::memcpy(&v, at, 4);
        owned_[i] = v;
      }
    }
  }

  std::vector<int64_t> owned_;
  std::span<const int64_t> view_;
};

}  // namespace

PoolAuditor::PoolAuditor(const pyb::list& pools, bool ue8m0) {
  if (pools.empty()) throw pyb::value_error("argument 'pools' must name at least one pool");
  for (const pyb::handle item : pools) {
    const auto pair = item.cast<pyb::tuple>();
    arrays_.emplace_back(pair[1], "pools", /*keep=*/true);
    const ArrayArg& a = arrays_.back();
    const PoolLayout layout = infer_pool_layout(a);
    Pool p{pair[0].cast<int>(), layout, pool_view(a, layout.kind, layout.dtype, ue8m0), {}, {}};
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

PoolAuditor::RowValues PoolAuditor::parse_values(const pyb::object& values, int rows) const {
  const size_t np = pools_.size();
  if (!pyb::isinstance<pyb::list>(values) && !pyb::isinstance<pyb::tuple>(values)) {
    throw pyb::type_error(
        fmt::format("argument 'values' must be a list with one entry per pool ({} pools), got {}",
                    np, type_name(values)));
  }
  const auto entries = values.cast<pyb::sequence>();
  if (entries.size() != np) {
    throw pyb::value_error(
        fmt::format("argument 'values' needs one entry per pool in the order of 'pools': the "
                    "auditor watches {} pools, got {} entries",
                    np, entries.size()));
  }
  RowValues out;
  // Checks one array of `values`; returns it, and its row stride in *ld.
  auto array = [&](pyb::handle obj, std::string name, int64_t width,
                   int64_t* ld) -> const ArrayArg& {
    out.names.push_back(std::move(name));
    out.arrays.emplace_back(obj, out.names.back().c_str());
    const ArrayArg& a = out.arrays.back();
    *ld = need_f32_rows(a, width, rows, arrays_.front());
    if (a.dim(0) != rows) {
      throw pyb::value_error(fmt::format("argument '{}' needs {} rows, one per slot; got {}",
                                         a.name(), rows, a.describe()));
    }
    return a;
  };
  for (size_t p = 0; p < np; ++p) {
    const Pool& pool = pools_[p];
    const pyb::object entry = entries[p];
    const bool pair = pyb::isinstance<pyb::list>(entry) || pyb::isinstance<pyb::tuple>(entry);
    const std::string where =
        fmt::format("is for layer {}'s {} pool", pool.layer, pool_layout_label(pool.layout));
    DigestRowsParams d;
    d.kind = pool.layout.kind;
    d.dtype = pool.view.dtype;
    d.rounding = pool.view.rounding;
    d.rows = rows;
    if (pool.layout.kind == PoolKind::kIndexK) {
      if (pair) {
        throw pyb::type_error(fmt::format(
            "argument 'values[{}]' {}: it must be one float32 [{}, 128] array, got a {}", p, where,
            rows, type_name(entry)));
      }
      d.values =
          array(entry, fmt::format("values[{}]", p), kIndexHeadDim, &d.ld_values).as<float>();
    } else {
      if (!pair || pyb::len(entry) != 2) {
        throw pyb::type_error(fmt::format(
            "argument 'values[{}]' {}: it must be a pair (c float32 [{}, 512], k_rope float32 "
            "[{}, 64]), got {}",
            p, where, rows, rows,
            pair ? fmt::format("{} entries", pyb::len(entry)) : type_name(entry)));
      }
      const auto two = entry.cast<pyb::sequence>();
      d.values =
          array(two[0], fmt::format("values[{}][0]", p), kKvLoraRank, &d.ld_values).as<float>();
      d.k_rope = array(two[1], fmt::format("values[{}][1]", p), kRopeDim, &d.ld_rope).as<float>();
    }
    out.params.push_back(d);
  }
  return out;
}

std::vector<uint64_t> PoolAuditor::pool_digests(Backend& backend,
                                                const std::vector<int64_t>& slots) {
  const size_t n = slots.size(), np = pools_.size();
  int64_t* d_slots = d_slots_.reserve(backend, place_, n);
  uint64_t* d_digests = d_digests_.reserve(backend, place_, n * np);
  backend.copy_to_device(d_slots, slots.data(), n * sizeof(int64_t));
  for (size_t p = 0; p < np; ++p) {
    AuditSlotsParams a;
    a.slots = d_slots;
    a.digests = d_digests + p * n;
    a.pool = pools_[p].view;
    a.kind = pools_[p].layout.kind;
    a.n = int(n);
    backend.audit_slots(a);
  }
  std::vector<uint64_t> digests(n * np);
  backend.copy_to_host(digests.data(), d_digests, digests.size() * sizeof(uint64_t));
  return digests;
}

std::vector<uint64_t> PoolAuditor::value_digests(Backend& backend, RowValues& values, int rows) {
  const size_t n = size_t(rows), np = pools_.size();
  // Every row is real here (n_real = rows): the caller's slots say which rows are padding.
  int32_t* d_n_real = d_n_real_.reserve(backend, place_, 1);
  uint64_t* d_digests = d_digests_.reserve(backend, place_, n * np);
  backend.copy_to_device(d_n_real, &rows, sizeof(int32_t));
  for (size_t p = 0; p < np; ++p) {
    DigestRowsParams& d = values.params[p];
    d.n_real = d_n_real;
    d.digests = d_digests + p * n;
    backend.digest_rows(d);
  }
  std::vector<uint64_t> digests(n * np);
  backend.copy_to_host(digests.data(), d_digests, digests.size() * sizeof(uint64_t));
  return digests;
}

void PoolAuditor::record(const pyb::object& slot_arg, const pyb::object& owner_arg,
                         const pyb::object& values, int64_t step, std::optional<uintptr_t> stream) {
  const HostInt64s slots(slot_arg, "slots", stream), owner_list(owner_arg, "owners", stream);
  // One owner stands for every slot.
  const bool one_owner = owner_list.size() == 1;
  auto owner_of = [&](size_t row) { return owner_list[one_owner ? 0 : row]; };
  if (slots.size() != owner_list.size() && !one_owner) {
    throw pyb::value_error(
        fmt::format("argument 'owners' needs one owner per slot: {} slots, {} "
                    "owners",
                    slots.size(), owner_list.size()));
  }
  if (slots.size() > size_t(INT32_MAX)) {
    throw pyb::value_error("argument 'slots' has more than 2^31 - 1 rows");
  }
  std::vector<int64_t> valid;
  std::vector<size_t> valid_row;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    if (s == kPadSlot || (s >= 0 && s < kPageSize)) continue;  // padding and the reserved page
    if (s < 0 || s >= capacity_) {
      throw pyb::value_error(fmt::format(
          "argument 'slots': slot {} (row {}) is outside the pools' {} slots", s, i, capacity_));
    }
    if (owner_of(i) < 0) {
      throw pyb::value_error(
          fmt::format("argument 'owners': owner {} (row {}) must be >= 0", owner_of(i), i));
    }
    valid.push_back(s);
    valid_row.push_back(i);
  }
  const int rows = int(slots.size());
  const bool from_values = !values.is_none();
  RowValues parsed = from_values ? parse_values(values, rows) : RowValues{};
  if (valid.empty()) return;
  const size_t n = valid.size(), np = pools_.size();
  auto backend = backend_for(place_, caller_stream(stream, place_));
  // digests[p * width + at(i)] is pool p's expected digest of valid[i].
  const std::vector<uint64_t> digests =
      from_values ? value_digests(*backend, parsed, rows) : pool_digests(*backend, valid);
  const size_t width = from_values ? size_t(rows) : n;
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = valid[i];
    const size_t at = from_values ? valid_row[i] : i;
    if (owner_[s] < 0) {
      pos_[s] = int64_t(live_.size());
      live_.push_back(s);
      for (Pool& p : pools_) p.expected.push_back(0);
    }
    owner_[s] = owner_of(valid_row[i]);
    written_[s] = step;
    for (size_t p = 0; p < np; ++p) pools_[p].expected[pos_[s]] = digests[p * width + at];
    mark_dirty(pos_[s]);
  }
  if (mirrored_count_ >= 0) flush(*backend);  // a captured verify reads the mirror as it is
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

void PoolAuditor::release(const pyb::object& slots) {
  const HostInt64s list(slots, "slots");
  for (int64_t s : list.get()) forget_at(s);
}

void PoolAuditor::release_owner(int64_t owner) {
  std::vector<int64_t> theirs;
  for (int64_t s : live_) {
    if (owner_[s] == owner) theirs.push_back(s);
  }
  for (int64_t s : theirs) forget_at(s);
}

void PoolAuditor::tick(Phase p) {
  clock_[p] =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (p == kStart) std::fill(clock_.begin() + 1, clock_.end(), clock_[kStart]);
}

std::vector<std::pair<std::string, double>> PoolAuditor::last_verify_us() const {
  static constexpr const char* kNames[] = {"pick", "stage", "launch", "wait", "findings"};
  std::vector<std::pair<std::string, double>> out;
  for (int p = kPicked; p <= kDone; ++p) {
    out.emplace_back(kNames[p - 1], 1e6 * (clock_[size_t(p)] - clock_[size_t(p - 1)]));
  }
  out.emplace_back("total", 1e6 * (clock_[kDone] - clock_[kStart]));
  return out;
}

std::vector<Finding> PoolAuditor::compare(Backend& backend, int32_t* d_mismatches,
                                          const int64_t* d_slots, const uint64_t* const* d_expected,
                                          const int64_t* host_slots, size_t n, int64_t step) {
  const size_t np = pools_.size();
  uint64_t* d_digests = d_digests_.reserve(backend, place_, n);
  uint8_t* d_flags = d_flags_.reserve(backend, place_, n);
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
  tick(kLaunched);
  // The counters come back into pinned memory: one wait for the device.
  auto* counts = reinterpret_cast<int32_t*>(h_stage_.reserve(backend, place_, (np + 1) / 2));
  backend.copy_to_host(counts, d_mismatches, np * sizeof(int32_t));
  tick(kWaited);
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
  tick(kDone);
  return findings;
}

std::vector<Finding> PoolAuditor::verify_all(int64_t step, std::optional<uintptr_t> stream) {
  tick(kStart);
  const size_t n = live_.size();
  if (n == 0) return {};
  auto backend = backend_for(place_, caller_stream(stream, place_));
  tick(kPicked);
  flush(*backend);
  expected_ptrs_.clear();
  for (Pool& p : pools_) expected_ptrs_.push_back(p.d_expected.data());
  int32_t* d_mismatches = d_mismatches_.reserve(*backend, place_, pools_.size());
  backend->fill(d_mismatches, 0, pools_.size() * sizeof(int32_t));
  tick(kStaged);
  return compare(*backend, d_mismatches, d_live_.data(), expected_ptrs_.data(), live_.data(), n,
                 step);
}

std::vector<Finding> PoolAuditor::verify_positions(const std::vector<int64_t>& positions,
                                                   int64_t step, std::optional<uintptr_t> stream) {
  const size_t m = positions.size(), np = pools_.size();
  if (m == 0) return {};
  auto backend = backend_for(place_, caller_stream(stream, place_));
  tick(kPicked);
  // One upload from pinned memory, in 8-byte words: the zeroed int32 counters [np] (padded),
  // the slots [m], then each pool's expected digests [m].
  const size_t head = (np + 1) / 2, words = head + m + np * m;
  uint64_t* h = h_stage_.reserve(*backend, place_, words);
  uint64_t* d = d_stage_.reserve(*backend, place_, words);
  std::memset(h, 0, head * sizeof(uint64_t));
  auto* slots = reinterpret_cast<int64_t*>(h + head);
  uint64_t* expected = h + head + m;
  // A gather of scattered positions from host arrays of up to millions of entries: each read is a
  // likely cache miss, so the lines of the entry kPrefetch ahead are requested early.
  constexpr size_t kPrefetch = 16;
  for (size_t i = 0; i < m; ++i) {
    if (i + kPrefetch < m) {
      const auto ahead = size_t(positions[i + kPrefetch]);
      __builtin_prefetch(live_.data() + ahead);
      for (const Pool& p : pools_) __builtin_prefetch(p.expected.data() + ahead);
    }
    const auto at = size_t(positions[i]);
    slots[i] = live_[at];
    for (size_t p = 0; p < np; ++p) expected[p * m + i] = pools_[p].expected[at];
  }
  backend->copy_to_device(d, h, words * sizeof(uint64_t));
  expected_ptrs_.clear();
  for (size_t p = 0; p < np; ++p) expected_ptrs_.push_back(d + head + m + p * m);
  tick(kStaged);
  // The counters come back over h's head, after the upload has read it (same stream, in order);
  // the slots stay in h for the findings.
  return compare(*backend, reinterpret_cast<int32_t*>(d),
                 reinterpret_cast<const int64_t*>(d + head), expected_ptrs_.data(), slots, m, step);
}

std::vector<Finding> PoolAuditor::verify_slots(const pyb::object& slot_arg, int64_t step,
                                               std::optional<uintptr_t> stream) {
  tick(kStart);
  positions_.clear();
  const HostInt64s slots(slot_arg, "what", stream);
  for (int64_t s : slots.get()) {
    if (s >= 0 && s < capacity_ && owner_[s] >= 0) positions_.push_back(pos_[s]);
  }
  std::sort(positions_.begin(), positions_.end());
  positions_.erase(std::unique(positions_.begin(), positions_.end()), positions_.end());
  return verify_positions(positions_, step, stream);
}

std::vector<Finding> PoolAuditor::verify_sample(int64_t count, uint64_t seed, int64_t step,
                                                std::optional<uintptr_t> stream) {
  tick(kStart);
  if (count < 0)
    throw pyb::value_error(fmt::format("argument 'sample' must be >= 0, got {}", count));
  const int64_t n = int64_t(live_.size());
  if (count >= n) return verify_all(step, stream);
  if (count == 0) return {};
  // One draw in each of `count` strata of [0, n) (audit_sample_position: the rule the device's
  // audit_sample draws by): the positions come out sorted and distinct by construction (no sort,
  // no dedup), each position is drawn with probability 1 / its stratum's width (about count / n),
  // and every sample spreads over the whole watched set. O(count), into a kept buffer.
  positions_.resize(size_t(count));
  const uint64_t start = audit_sample_start(seed, step);
  const int64_t width = n / count, wider = n % count;
  for (int64_t i = 0; i < count; ++i) {
    positions_[size_t(i)] = audit_sample_position(start, i, width, wider);
  }
  return verify_positions(positions_, step, stream);
}

}  // namespace dsa::py
