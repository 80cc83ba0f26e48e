// The sampled audit (audit_sample) on both backends: the positions drawn, the device step counter
// and the findings record must match byte for byte. Two pools of random bytes, a watched set in a
// shuffled order, and one expected digest wrong (pool 1, at a position the first launch draws), so
// every launch finds at most one mismatch and the record's order is fixed. Three launches: a
// sample at a given step, the next step from the counter, and every position on a second record.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "dsa/slot.h"
#include "dsa/slot_digest.h"
#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

constexpr int64_t kPages = 40;

class AuditSampleCase final : public OpCase {
 public:
  AuditSampleCase(KvDtype dtype, int watched, int sample)
      : dtype_(dtype), watched_(watched), sample_(sample) {}
  ~AuditSampleCase() override {
    for (auto& [backend, p] : owned_) backend->deallocate(p);
  }
  std::string name() const override { return "audit_sample"; }
  std::string vars() const override {
    return std::string("dtype=") + kv_dtype_name(dtype_) + ",watched=" + std::to_string(watched_) +
           ",sample=" + std::to_string(sample_);
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    const int64_t bytes[2] = {kPages * index_k_page_bytes(dtype_),
                              kPages * latent_page_bytes(dtype_)};
    std::vector<int64_t> live(size_t(kPages - 1) * kPageSize);
    std::iota(live.begin(), live.end(), kPageSize);
    for (size_t i = live.size() - 1; i > 0; --i) {
      std::swap(live[i], live[size_t(rng.integer(0, int64_t(i)))]);
    }
    live.resize(size_t(watched_));
    for (int p = 0; p < 2; ++p) {
      std::vector<uint8_t> pool(size_t(bytes[p]));
      for (auto& b : pool) b = uint8_t(rng.integer(0, 255));
      std::vector<uint64_t> expected(live.size());
      const PoolView view{pool.data(), dtype_, ScaleRounding::kExact, kPages};
      for (size_t i = 0; i < live.size(); ++i) {
        expected[i] = slot_digest(p == 0 ? index_k_slot_bytes(view, live[i])
                                         : latent_slot_bytes(view, live[i]));
      }
      if (p == 1) {  // wrong at a position the first launch (step kStep) draws
        const int64_t n = watched_, count = std::min<int64_t>(sample_, n);
        const int64_t i = count / 2;
        const int64_t pos = sample_ >= n ? i
                                         : audit_sample_position(audit_sample_start(kSeed, kStep),
                                                                 i, n / count, n % count);
        expected[size_t(pos)] ^= 1;
      }
      pools_[p] = ws.inout(pool, Check::exact());
      expected_[p] = ws.input(expected);
    }
    live_ = ws.input(live);
    count_ = ws.input(std::vector<int64_t>{watched_});
    AuditSampleRecord start{};
    start.next_step = 41;
    std::vector<uint8_t> record(sizeof(start));
    std::memcpy(record.data(), &start, sizeof(start));
    records_[0] = ws.inout(record, Check::exact());
    records_[1] = ws.inout(record, Check::exact());
    drawn_[0] = ws.output<int64_t>(size_t(sample_), Check::exact(), RowLayout::kWhole);
    drawn_[1] = ws.output<int64_t>(size_t(sample_), Check::exact(), RowLayout::kWhole);
  }
  void run(Workspace& ws, Side side) override {
    Backend& be = ws.backend(side);
    AuditPool pools[2];
    for (int p = 0; p < 2; ++p) {
      pools[p] = {PoolView{ws.ptr(pools_[p], side), dtype_, ScaleRounding::kExact, kPages},
                  p == 0 ? PoolKind::kIndexK : PoolKind::kLatent, 7 + p,
                  ws.ptr(expected_[p], side)};
    }
    void* table = be.allocate(sizeof(pools));  // device pointers: one table per side
    owned_.emplace_back(&be, table);
    be.copy_to_device(table, pools, sizeof(pools));
    be.synchronize();
    AuditSampleParams a;
    a.live = ws.ptr(live_, side);
    a.live_count = ws.ptr(count_, side);
    a.pools = static_cast<const AuditPool*>(table);
    a.n_pools = 2;
    a.seed = kSeed;
    auto launch = [&](int record, int64_t* drawn, int sample, int64_t step) {
      a.findings = reinterpret_cast<AuditSampleRecord*>(ws.ptr(records_[record], side));
      a.drawn = drawn;
      a.sample = sample;
      a.step = step;
      be.audit_sample(a);
    };
    launch(0, ws.ptr(drawn_[0], side), sample_, kStep);
    launch(0, ws.ptr(drawn_[1], side), sample_, -1);  // kStep + 1, from the counter
    launch(1, nullptr, watched_, -1);                 // every position, at step 41
  }

 private:
  static constexpr uint64_t kSeed = 0x5EEDull;
  static constexpr int64_t kStep = 1000;
  KvDtype dtype_;
  int watched_, sample_;
  Buf<uint8_t> pools_[2], records_[2];
  Buf<uint64_t> expected_[2];
  Buf<int64_t> live_, count_, drawn_[2];
  std::vector<std::pair<Backend*, void*>> owned_;
};

class ParityAudit : public ParityTest {};

TEST_F(ParityAudit, SampledAuditMatchesCpu) {
  int cases = 0;
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (auto [watched, sample] :
         {std::pair{1, 1}, {700, 1}, {700, 256}, {2000, 129}, {2496, 2496}, {300, 512}}) {
      AuditSampleCase c(dtype, watched, sample);
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 9000 + cases++));
    }
  }
}

}  // namespace
}  // namespace dsa::parity
