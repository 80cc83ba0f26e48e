// The auditor's device mirror and its asynchronous sampled verify: one audit_sample launch per
// call, no wait; findings collected later through a pinned snapshot behind a fence (auditor.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>

#include "dsa/slot_digest.h"
#include "python/auditor.h"

namespace dsa::py {
namespace pyb = pybind11;

namespace {
// The part of AuditSampleRecord a snapshot copies and zeroes: everything after the op's own state.
constexpr size_t kCollectedAt = offsetof(AuditSampleRecord, verifies);
constexpr size_t kCollectedBytes = sizeof(AuditSampleRecord) - kCollectedAt;

// Whether torch, when imported, is capturing a CUDA graph on its current stream: the mirror's
// upload (a copy from pageable memory) must not be captured.
bool torch_capturing() {
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return false;
  return pyb::handle(torch).attr("cuda").attr("is_current_stream_capturing")().cast<bool>();
}
}  // namespace

PoolAuditor::~PoolAuditor() {
  if (!pending_) return;
  try {
    pending_->wait();
  } catch (...) {  // the device faulted: nothing left to protect
  }
}

bool PoolAuditor::mirror_dirty() const {
  return mirrored_count_ < 0 || dirty_lo_ < dirty_hi_ || mirrored_count_ != int64_t(live_.size());
}

void PoolAuditor::flush(Backend& backend) {
  const size_t cap = size_t(capacity_), np = pools_.size();
  if (mirrored_count_ < 0) {
    // Once, at full capacity: the addresses never move, so a launch captured in a graph stays
    // valid.
    d_live_.reserve(backend, place_, cap);
    d_count_.reserve(backend, place_, 1);
    std::vector<AuditPool> pools(np);
    for (size_t p = 0; p < np; ++p) {
      pools[p] = {pools_[p].view, pools_[p].layout.kind, pools_[p].layer,
                  pools_[p].d_expected.reserve(backend, place_, cap)};
    }
    backend.copy_to_device(d_pools_.reserve(backend, place_, np), pools.data(),
                           np * sizeof(AuditPool));
    backend.fill(d_findings_.reserve(backend, place_, 1), 0, sizeof(AuditSampleRecord));
    h_findings_.reserve(backend, place_, 1);
    dirty_lo_ = 0;
    dirty_hi_ = int64_t(live_.size());
  }
  const int64_t n = int64_t(live_.size());
  const int64_t lo = dirty_lo_, hi = std::min(dirty_hi_, n);
  if (lo < hi) {
    const auto count = size_t(hi - lo);
    backend.copy_to_device(d_live_.data() + lo, live_.data() + lo, count * sizeof(int64_t));
    for (Pool& p : pools_) {
      backend.copy_to_device(p.d_expected.data() + lo, p.expected.data() + lo,
                             count * sizeof(uint64_t));
    }
  }
  dirty_lo_ = dirty_hi_ = 0;
  if (mirrored_count_ != n) {
    mirrored_count_ = n;
    backend.copy_to_device(d_count_.data(), &mirrored_count_, sizeof(int64_t));
  }
}

void PoolAuditor::flush(std::optional<uintptr_t> stream) {
  flush(*backend_for(place_, caller_stream(stream, place_)));
}

void PoolAuditor::verify_async(int64_t count, uint64_t seed, int64_t step,
                               std::optional<uintptr_t> stream) {
  tick(kStart);
  if (count < -1 || count > INT32_MAX) {
    throw pyb::value_error(
        fmt::format("argument 'sample' must be in [0, 2^31) (or all), got {}", count));
  }
  if (place_.cuda() && mirror_dirty() && torch_capturing()) {
    throw std::runtime_error(
        "verify(wait=False) under graph capture needs the device mirror current: call "
        "auditor.flush() before capturing (and after release() with no record since)");
  }
  auto backend = backend_for(place_, caller_stream(stream, place_));
  flush(*backend);
  tick(kPicked);
  tick(kStaged);
  AuditSampleParams p;
  p.live = d_live_.data();
  p.live_count = d_count_.data();
  p.pools = d_pools_.data();
  p.findings = d_findings_.data();
  p.n_pools = int(pools_.size());
  p.sample = int(count < 0 ? std::min<int64_t>(capacity_, INT32_MAX) : count);
  p.seed = seed;
  p.step = step;
  backend->audit_sample(p);
  tick(kLaunched);
  tick(kWaited);
  tick(kDone);
}

void PoolAuditor::collect(std::vector<Finding>& out) {
  const AuditSampleRecord& h = *h_findings_.data();
  async_verifies_ += int64_t(h.verifies);
  async_mismatches_ += int64_t(h.mismatches);
  const uint32_t kept = std::min<uint32_t>(h.kept, kSampledMismatchesKept);
  for (uint32_t i = 0; i < kept; ++i) {
    const SampledMismatch& f = h.first[i];
    const Pool& pool = pools_[size_t(f.pool)];
    const bool known = f.slot >= 0 && f.slot < capacity_;
    out.emplace_back(pool.layer, pool.layout.kind == PoolKind::kIndexK ? "index_k" : "latent",
                     f.slot, known ? owner_[f.slot] : -1, known ? written_[f.slot] : -1, f.step);
  }
}

std::vector<Finding> PoolAuditor::poll(bool wait, std::optional<uintptr_t> stream) {
  std::vector<Finding> out;
  if (mirrored_count_ < 0) return out;  // nothing was ever launched
  auto reached = [&] {
    if (wait) pending_->wait();
    return wait || pending_->reached();
  };
  if (pending_ && reached()) {
    collect(out);
    pending_.reset();
  }
  if (!pending_) {
    auto backend = backend_for(place_, caller_stream(stream, place_));
    auto* device = reinterpret_cast<uint8_t*>(d_findings_.data()) + kCollectedAt;
    backend->copy_to_host_async(reinterpret_cast<uint8_t*>(h_findings_.data()) + kCollectedAt,
                                device, kCollectedBytes);
    backend->fill(device, 0, kCollectedBytes);  // in stream order: after the copy read it
    pending_ = backend->fence();
    if (reached()) {
      collect(out);
      pending_.reset();
    }
  }
  return out;
}

std::vector<int64_t> PoolAuditor::sample_positions(int64_t count, uint64_t seed, int64_t step,
                                                   bool device, std::optional<uintptr_t> stream) {
  if (count <= 0 || count > INT32_MAX) {
    throw pyb::value_error(fmt::format("argument 'count' must be in [1, 2^31), got {}", count));
  }
  const int64_t n = int64_t(live_.size());
  std::vector<int64_t> out(size_t(count), -1);
  if (!device) {
    const uint64_t start = audit_sample_start(seed, step);
    for (int64_t i = 0; i < count; ++i) {
      out[size_t(i)] =
          count >= n ? (i < n ? i : -1) : audit_sample_position(start, i, n / count, n % count);
    }
    return out;
  }
  auto backend = backend_for(place_, caller_stream(stream, place_));
  flush(*backend);
  DeviceScratch<AuditSampleRecord> findings;  // its own record: the auditor's stays untouched
  DeviceScratch<int64_t> drawn;
  AuditSampleParams p;
  p.live = d_live_.data();
  p.live_count = d_count_.data();
  p.pools = d_pools_.data();
  p.findings = findings.reserve(*backend, place_, 1);
  p.drawn = drawn.reserve(*backend, place_, size_t(count));
  p.n_pools = int(pools_.size());
  p.sample = int(count);
  p.seed = seed;
  p.step = step;
  backend->fill(p.findings, 0, sizeof(AuditSampleRecord));
  backend->audit_sample(p);
  backend->copy_to_host(out.data(), p.drawn, out.size() * sizeof(int64_t));
  return out;
}

}  // namespace dsa::py
