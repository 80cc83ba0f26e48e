// The slot-integrity auditor (DESIGN §6) over pools the caller owns. After the caller's own store,
// record() remembers each written slot's owner, step and expected digest in every watched pool:
// the digest of what the real row meant to write when the caller passes the store's inputs (the
// backend's digest_rows: the writers' encoder, then the digest, so a padded row that clobbered the
// slot in the same step cannot become the truth), else the digest read back from the pool. verify()
// later recomputes digests with the backend's audit_slots op (a kernel on the GPU: the pool never
// leaves the device; only 8-byte digests of newly recorded slots and, on a mismatch, 1-byte flags
// come back) and reports every slot whose bytes changed behind its owner's back.
//
// Host state is indexed by slot; the device keeps a mirror of the watched slots, their count and
// their expected digests, sized to the pools' capacity once (so its addresses never move and a
// captured launch stays valid) and uploaded incrementally (only positions changed since the last
// upload; record() uploads its own), so verifying all of a large pool costs one kernel per pool
// and one 4-byte read per pool. A verify of listed or sampled slots stages them, their expected
// digests and the zeroed mismatch counters in pinned host memory: one asynchronous copy up, one
// kernel per pool, one copy of the counters down -- a single wait for the device per verify.
//
// The always-on audit waits for nothing: verify_async() is one launch of the backend's
// audit_sample op over the mirror (the sample drawn on the device from (seed, a device step
// counter), every pool in the one launch), which counts mismatches into a device findings record;
// poll() copies that record into pinned memory behind a fence and reads it once the fence is
// reached, a later call.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dsa/backend.h"
#include "python/array_arg.h"
#include "python/pools.h"

namespace dsa::py {

// Memory kept between calls: device memory, or (kHost) pinned host memory the device copies from
// and to without a wait. Allocated through the backend of the call that needs it, and freed through
// a backend made for the moment (a caller-stream backend holds the thread's device only while it
// lives).
template <typename T, bool kHost = false>
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  DeviceScratch(DeviceScratch&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        place_(o.place_) {}
  DeviceScratch& operator=(DeviceScratch&&) = delete;
  ~DeviceScratch() { release(); }
  // Grows to at least n elements (contents are not kept).
  T* reserve(Backend& backend, Place place, size_t n) {
    if (n <= size_) return data_;
    release();
    const size_t grown = n < 2 * size_ ? 2 * size_ : n;
    data_ = allocate(backend, grown);
    size_ = grown;
    place_ = place;
    return data_;
  }
  T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release() {
    if (data_) {
      if constexpr (kHost) {
        backend_for(place_, 0)->deallocate_host(data_);
      } else {
        backend_for(place_, 0)->deallocate(data_);
      }
    }
    data_ = nullptr;
    size_ = 0;
  }
  T* allocate(Backend& backend, size_t n) {
    if constexpr (kHost) {
      return static_cast<T*>(backend.allocate_host(n * sizeof(T)));
    } else {
      return static_cast<T*>(backend.allocate(n * sizeof(T)));
    }
  }
  T* data_ = nullptr;
  size_t size_ = 0;
  Place place_;
};

template <typename T>
using PinnedScratch = DeviceScratch<T, true>;

// layer, pool ("index_k" | "latent"), slot, owner, step written, step detected
using Finding = std::tuple<int, std::string, int64_t, int64_t, int64_t, int64_t>;

class PoolAuditor {
 public:
  // pools: (layer, array) pairs; every array is a dsa pool (pools.h) on one device, all of the
  // same capacity in slots. ue8m0: the fp8 pools' scales are rounded up to powers of two (how
  // their writer was called; it decides the digest of a row's values).
  PoolAuditor(const pybind11::list& pools, bool ue8m0);
  PoolAuditor(const PoolAuditor&) = delete;
  PoolAuditor& operator=(const PoolAuditor&) = delete;
  ~PoolAuditor();  // waits for a snapshot in flight (its copy lands in memory freed here)

  // values: None, or one entry per pool (in the order of `pools`) holding what the store was given
  // for the rows of `slots`: float32 [rows, 128] for an index-K pool, a pair (float32 [rows, 512]
  // c, float32 [rows, 64] k_rope) for a latent pool.
  // slots, owners (and release's and verify_slots' slots): a Python int or sequence of ints, or an
  // int64/int32 array (numpy, torch; read in place on the CPU, copied down once from CUDA). One
  // owner stands for all slots.
  void record(const pybind11::object& slots, const pybind11::object& owners,
              const pybind11::object& values, int64_t step, std::optional<uintptr_t> stream);
  void release(const pybind11::object& slots);
  void release_owner(int64_t owner);

  std::vector<Finding> verify_all(int64_t step, std::optional<uintptr_t> stream);
  std::vector<Finding> verify_slots(const pybind11::object& slots, int64_t step,
                                    std::optional<uintptr_t> stream);
  std::vector<Finding> verify_sample(int64_t count, uint64_t seed, int64_t step,
                                     std::optional<uintptr_t> stream);

  // ---- the asynchronous sampled verify (auditor_async.cpp) ----
  // Uploads what changed in the mirror (nothing, when record() ran last) and enqueues one
  // audit_sample launch of `count` draws (count < 0: every watched slot) at `step` (< 0: the
  // device's step counter, advanced by every launch). Returns at once.
  void verify_async(int64_t count, uint64_t seed, int64_t step, std::optional<uintptr_t> stream);
  // The findings of launches completed before the fence of the last snapshot: reads that snapshot
  // when its fence is reached (wait: waits for it), then enqueues the next one (copy of the device
  // record into pinned memory, zeroing it, a fence). Each finding names the owner the slot has
  // now and the step it was written.
  std::vector<Finding> poll(bool wait, std::optional<uintptr_t> stream);
  void flush(std::optional<uintptr_t> stream);  // uploads what changed in the mirror
  bool mirror_dirty() const;                    // the mirror lags the host (release() since)
  // (launches, mismatching checks) read by poll() so far, every mismatch counted (poll() returns
  // the first kSampledMismatchesKept of each snapshot).
  std::pair<int64_t, int64_t> async_counts() const { return {async_verifies_, async_mismatches_}; }
  // The positions of the watched set a sample of `count` at (seed, step) checks, by the host's rule
  // or (device) by the audit_sample op itself; -1 past the set. For tests.
  std::vector<int64_t> sample_positions(int64_t count, uint64_t seed, int64_t step, bool device,
                                        std::optional<uintptr_t> stream);

  int64_t watched() const { return int64_t(live_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t audited() const { return audited_; }
  std::vector<std::string> describe_pools() const;
  // The host time of the last verify by phase, in microseconds: pick (choosing the slots), stage
  // (filling the pinned upload and enqueueing it), launch (enqueueing the kernels), wait (the copy
  // of the counters down: the device's work and the round trip), findings, total.
  std::vector<std::pair<std::string, double>> last_verify_us() const;

 private:
  struct Pool {
    int layer;
    PoolLayout layout;
    PoolView view;
    std::vector<uint64_t> expected;  // [live_.size()] digest recorded for live_[i]
    DeviceScratch<uint64_t> d_expected;
  };
  // record()'s `values`, checked against the pools, and the digest_rows of each pool over them.
  struct RowValues {
    std::deque<std::string> names;         // an ArrayArg keeps a pointer to its name
    std::vector<ArrayArg> arrays;          // the caller's arrays, alive until the digests are back
    std::vector<DigestRowsParams> params;  // [pools]; digests and n_real are set when run
  };
  RowValues parse_values(const pybind11::object& values, int rows) const;
  // Digests [pools, slots.size()] of the pools' bytes at `slots` (audit_slots).
  std::vector<uint64_t> pool_digests(Backend& backend, const std::vector<int64_t>& slots);
  // Digests [pools, rows] of what each row of the values encodes to in each pool (digest_rows).
  std::vector<uint64_t> value_digests(Backend& backend, RowValues& values, int rows);
  void forget_at(int64_t slot);
  void mark_dirty(int64_t pos);
  // Allocates the device mirror at full capacity (once), then uploads its dirty range and count.
  void flush(Backend& backend);
  void collect(std::vector<Finding>& out);  // the pinned snapshot into findings
  // Runs the compare of d_slots[0, n) against d_expected[p] for every pool; d_mismatches [pools]
  // is zeroed (queued) by the caller. host_slots [n] name the slots for findings.
  std::vector<Finding> compare(Backend& backend, int32_t* d_mismatches, const int64_t* d_slots,
                               const uint64_t* const* d_expected, const int64_t* host_slots,
                               size_t n, int64_t step);
  std::vector<Finding> verify_positions(const std::vector<int64_t>& positions, int64_t step,
                                        std::optional<uintptr_t> stream);

  std::vector<ArrayArg> arrays_;  // keeps the caller's pools alive
  std::vector<Pool> pools_;
  Place place_;
  int64_t capacity_ = 0;

  // Indexed by slot; owner_ < 0 means not watched.
  std::vector<int64_t> owner_, written_, pos_;
  std::vector<int64_t> live_;            // watched slots, in no order
  int64_t dirty_lo_ = 0, dirty_hi_ = 0;  // live_ positions not yet mirrored on the device
  int64_t mirrored_count_ = -1;          // live_.size() on the device (-1: no mirror yet)
  int64_t audited_ = 0;
  enum Phase { kStart, kPicked, kStaged, kLaunched, kWaited, kDone, kPhases };
  std::array<double, kPhases> clock_{};  // seconds, of the last verify
  void tick(Phase p);

  DeviceScratch<int64_t> d_live_, d_slots_, d_count_;
  DeviceScratch<AuditPool> d_pools_;
  DeviceScratch<AuditSampleRecord> d_findings_;
  PinnedScratch<AuditSampleRecord> h_findings_;
  std::unique_ptr<Fence> pending_;  // the snapshot in h_findings_, when one is in flight
  int64_t async_verifies_ = 0, async_mismatches_ = 0;
  DeviceScratch<uint64_t> d_digests_, d_stage_;
  PinnedScratch<uint64_t>
      h_stage_;                     // a listed verify's upload; [0, pools) int32 counters come back
  std::vector<int64_t> positions_;  // a listed or sampled verify's live_ positions, kept
  std::vector<const uint64_t*> expected_ptrs_;
  DeviceScratch<uint8_t> d_flags_;
  DeviceScratch<int32_t> d_mismatches_, d_n_real_;
};

}  // namespace dsa::py
