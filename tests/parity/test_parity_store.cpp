// Parity of the cache writers (DESIGN §3): for both layouts and every cache dtype, the WHOLE pool
// after a CUDA store must be byte-identical to the pool after the CPU store, and so must the
// step's error counter. The pool starts as random bytes (page 0 included), so a write to any
// slot that the contract forbids shows as a byte difference, and the guards around the pool
// catch a write past either end.
//
// Slot maps mix valid slots with: -1 pads at the head, middle and tail; a stale tail past n_real
// holding valid slots; slots in the reserved page 0; slots at and past capacity; other negative
// slots. Byte-exact stores at every batch size also make the writers batch-invariant: a row's
// bytes depend only on that row (the CPU writer is a row loop).
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "dsa/slot.h"
#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

enum class Layout { kIndexK, kLatent };
enum class SlotMix { kValid, kPadded, kStaleTail, kReserved, kBadSlots, kEverything };

const char* mix_name(SlotMix m) {
  switch (m) {
    case SlotMix::kValid:
      return "valid";
    case SlotMix::kPadded:
      return "padded";
    case SlotMix::kStaleTail:
      return "stale_tail";
    case SlotMix::kReserved:
      return "reserved";
    case SlotMix::kBadSlots:
      return "bad_slots";
    case SlotMix::kEverything:
      return "everything";
  }
  return "?";
}

constexpr int64_t kPages = 24;  // capacity 1536 slots: room for 256 distinct valid slots
constexpr int64_t kCapacity = kPages * kPageSize;

struct StoreSpec {
  Layout layout;
  KvDtype dtype;
  ScaleRounding rounding;
  int rows;
  SlotMix mix;
  bool padded_stride;  // row strides not a multiple of 4 floats: the kernels' scalar path
  StoreGuard guard = StoreGuard::kEnforced;
  bool bf16_keys = false;  // index-K keys given as bf16 (StoreIndexKParams::k_bf16)
};

// The slot map and n_real of a spec. Valid slots are distinct and avoid the last page, so that
// the incident scatter's wrapped negatives (capacity - 1, - 2, - 3) collide with nothing.
std::vector<int64_t> make_slots(const StoreSpec& s, testing::Rng& rng, int32_t& n_real) {
  std::vector<int64_t> pool_slots(size_t(kCapacity - 2 * kPageSize));
  std::iota(pool_slots.begin(), pool_slots.end(), int64_t(kPageSize));
  std::shuffle(pool_slots.begin(), pool_slots.end(), rng.gen());
  std::vector<int64_t> slots(pool_slots.begin(), pool_slots.begin() + s.rows);
  n_real = s.rows;
  const int last = s.rows - 1, mid = s.rows / 2;
  const bool incident = s.guard == StoreGuard::kIncidentScatter;
  auto pad = [&](int r) { slots[r] = kPadSlot; };
  switch (s.mix) {
    case SlotMix::kValid:
      break;
    case SlotMix::kPadded:
      pad(0);
      if (!incident) pad(mid), pad(last);  // one -1 under the incident: it wraps to one slot
      break;
    case SlotMix::kStaleTail:
      n_real = s.rows / 3;
      break;  // 0 when rows == 1
    case SlotMix::kReserved:
      slots[0] = 0;
      slots[mid] = kPageSize - 1;
      slots[last] = 17;
      if (s.rows == 1) slots[0] = 5;
      break;
    case SlotMix::kBadSlots:
      slots[0] = kCapacity;
      slots[mid] = -2;
      slots[last] = kCapacity + 1000;
      if (s.rows >= 7) slots[1] = -kCapacity - 5, slots[2] = -3, slots[3] = INT64_MAX;
      break;
    case SlotMix::kEverything:
      if (s.rows < 7)
        return make_slots(
            {s.layout, s.dtype, s.rounding, s.rows, SlotMix::kBadSlots, s.padded_stride, s.guard},
            rng, n_real);
      pad(0);
      slots[1] = 3;
      slots[2] = kCapacity;
      slots[3] = -7;
      if (!incident) pad(mid);
      n_real = s.rows - 2;  // the last two rows are a stale tail
      break;
  }
  return slots;
}

// Per-row values over magnitudes that exercise fp8 saturation, subnormals and the 1e-4 amax floor.
std::vector<float> make_values(testing::Rng& rng, int rows, int64_t ld, int width) {
  static constexpr float kMagnitudes[] = {1.0f, 300.0f, 3e-3f, 2e-5f, 1e4f, 0.7f};
  std::vector<float> v(size_t(rows) * ld);
  for (int r = 0; r < rows; ++r) {
    const float mag = kMagnitudes[rng.integer(0, 5)];
    for (int64_t i = 0; i < ld; ++i) v[r * ld + i] = i < width ? rng.normal(mag) : 9.5e8f;
  }
  return v;
}

// bf16 keys: the values above rounded to bf16, and in every third row 128 random bit patterns
// (NaNs with payloads, infinities, subnormals), which a bf16 pool must keep bit for bit.
std::vector<Bf16> make_bf16_keys(testing::Rng& rng, int rows, int64_t ld) {
  const std::vector<float> v = make_values(rng, rows, ld, kIndexHeadDim);
  std::vector<Bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  for (int r = 0; r < rows; r += 3) {
    for (int i = 0; i < kIndexHeadDim; ++i)
      out[size_t(r * ld + i)].bits = uint16_t(rng.integer(0, 65535));
  }
  return out;
}

class StoreCase final : public OpCase {
 public:
  explicit StoreCase(StoreSpec spec) : s_(spec) {}
  std::string name() const override {
    return s_.layout == Layout::kIndexK ? "store_index_k" : "store_latent_kv";
  }
  std::string vars() const override {
    std::string v = std::string("dtype=") + kv_dtype_name(s_.dtype);
    if (s_.dtype == KvDtype::kFp8) v += s_.rounding == ScaleRounding::kUe8m0 ? "/ue8m0" : "/exact";
    v += ",rows=" + std::to_string(s_.rows) + ",slots=" + mix_name(s_.mix);
    if (s_.padded_stride) v += ",padded_stride";
    if (s_.guard == StoreGuard::kIncidentScatter) v += ",guard=incident_scatter";
    if (s_.bf16_keys) v += ",keys=bf16";
    return v;
  }

  void init(Workspace& ws, testing::Rng& rng) override {
    const int64_t page_bytes =
        s_.layout == Layout::kIndexK ? index_k_page_bytes(s_.dtype) : latent_page_bytes(s_.dtype);
    std::vector<uint8_t> pool(size_t(kPages * page_bytes));
    for (auto& b : pool) b = uint8_t(rng.integer(1, 255));
    pool_ = ws.inout(pool, Check::exact());
    errors_ = ws.inout(std::vector<int32_t>{3}, Check::exact());
    int32_t n_real = 0;
    slots_ = ws.input(make_slots(s_, rng, n_real));
    n_real_ = ws.input(std::vector<int32_t>{n_real});
    const int64_t extra = s_.padded_stride ? 3 : 0;
    if (s_.layout == Layout::kIndexK && s_.bf16_keys) {
      ld_a_ = kIndexHeadDim + extra;
      a16_ = ws.input(make_bf16_keys(rng, s_.rows, ld_a_));
    } else if (s_.layout == Layout::kIndexK) {
      ld_a_ = kIndexHeadDim + extra;
      a_ = ws.input(make_values(rng, s_.rows, ld_a_, kIndexHeadDim));
    } else {
      ld_a_ = kKvLoraRank + extra;
      ld_b_ = kRopeDim + extra;
      a_ = ws.input(make_values(rng, s_.rows, ld_a_, kKvLoraRank));
      b_ = ws.input(make_values(rng, s_.rows, ld_b_, kRopeDim));
    }
  }

  void run(Workspace& ws, Side side) override {
    SlotBatch batch{ws.ptr(slots_, side), ws.ptr(n_real_, side), s_.rows, ws.ptr(errors_, side)};
    PoolView pool{ws.ptr(pool_, side), s_.dtype, s_.rounding, kPages};
    if (s_.layout == Layout::kIndexK) {
      StoreIndexKParams p;
      p.batch = batch;
      if (s_.bf16_keys) {
        p.k_bf16 = ws.ptr(a16_, side);
      } else {
        p.k = ws.ptr(a_, side);
      }
      p.ld_k = ld_a_;
      p.pool = pool;
      p.guard = s_.guard;
      ws.backend(side).store_index_k(p);
    } else {
      StoreLatentKvParams p;
      p.batch = batch;
      p.latent = ws.ptr(a_, side);
      p.k_rope = ws.ptr(b_, side);
      p.ld_latent = ld_a_;
      p.ld_rope = ld_b_;
      p.pool = pool;
      ws.backend(side).store_latent_kv(p);
    }
  }

 private:
  StoreSpec s_;
  Buf<uint8_t> pool_;
  Buf<int32_t> errors_, n_real_;
  Buf<int64_t> slots_;
  Buf<float> a_, b_;
  Buf<Bf16> a16_;
  int64_t ld_a_ = 0, ld_b_ = 0;
};

// digest_rows beside a guarded store on each backend: the digests of what the rows meant to write
// (poisoned first; 0 past n_real), and audit_slots over the written slots compared with them on
// the device. Both backends must give the same digests and flags, and the CPU flags none, so the
// CUDA digest of the staged values is the digest of the bytes the CUDA store wrote.
class DigestRowsCase final : public OpCase {
 public:
  DigestRowsCase(Layout layout, KvDtype dtype, ScaleRounding rounding, int rows)
      : layout_(layout), dtype_(dtype), rounding_(rounding), rows_(rows) {}
  std::string name() const override { return "digest_rows"; }
  std::string vars() const override {
    return std::string(layout_ == Layout::kIndexK ? "index_k" : "latent") +
           ",dtype=" + kv_dtype_name(dtype_) +
           (rounding_ == ScaleRounding::kUe8m0 ? "/ue8m0" : "") + ",rows=" + std::to_string(rows_);
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    const int64_t page_bytes =
        layout_ == Layout::kIndexK ? index_k_page_bytes(dtype_) : latent_page_bytes(dtype_);
    pool_ = ws.inout(std::vector<uint8_t>(size_t(kPages * page_bytes), 0), Check::exact());
    n_real_ = std::max(1, rows_ - rows_ / 4);  // a stale tail of a quarter
    std::vector<int64_t> slots(static_cast<size_t>(rows_));
    std::iota(slots.begin(), slots.end(), int64_t(kPageSize) + 3);
    slots_ = ws.input(slots);
    n_real_buf_ = ws.input(std::vector<int32_t>{n_real_});
    errors_ = ws.inout(std::vector<int32_t>{0}, Check::exact());
    ld_a_ = (layout_ == Layout::kIndexK ? kIndexHeadDim : kKvLoraRank) + 3;
    ld_b_ = kRopeDim + 1;
    a_ = ws.input(make_values(rng, rows_, ld_a_, int(ld_a_ - 3)));
    b_ = ws.input(make_values(rng, rows_, ld_b_, kRopeDim));
    digests_ = ws.output<uint64_t>(size_t(rows_), Check::exact());
    audit_digests_ = ws.output<uint64_t>(size_t(n_real_), Check::exact());
    flags_ = ws.output<uint8_t>(size_t(n_real_), Check::exact());
    mismatches_ = ws.inout(std::vector<int32_t>{0}, Check::exact(), RowLayout::kWhole);
  }
  void run(Workspace& ws, Side side) override {
    Backend& be = ws.backend(side);
    const PoolView pool{ws.ptr(pool_, side), dtype_, rounding_, kPages};
    const SlotBatch batch{ws.ptr(slots_, side), ws.ptr(n_real_buf_, side), rows_,
                          ws.ptr(errors_, side)};
    const PoolKind kind = layout_ == Layout::kIndexK ? PoolKind::kIndexK : PoolKind::kLatent;
    if (kind == PoolKind::kIndexK) {
      be.store_index_k({batch, ws.ptr(a_, side), ld_a_, pool, StoreGuard::kEnforced});
    } else {
      be.store_latent_kv({batch, ws.ptr(a_, side), ws.ptr(b_, side), ld_a_, ld_b_, pool});
    }
    DigestRowsParams d;
    d.kind = kind;
    d.values = ws.ptr(a_, side);
    d.k_rope = ws.ptr(b_, side);
    d.ld_values = ld_a_;
    d.ld_rope = ld_b_;
    d.n_real = ws.ptr(n_real_buf_, side);
    d.rows = rows_;
    d.dtype = dtype_;
    d.rounding = rounding_;
    d.digests = ws.ptr(digests_, side);
    be.digest_rows(d);
    AuditSlotsParams a;
    a.slots = ws.ptr(slots_, side);
    a.digests = ws.ptr(audit_digests_, side);
    a.expected = ws.ptr(digests_, side);
    a.flags = ws.ptr(flags_, side);
    a.mismatches = ws.ptr(mismatches_, side);
    a.pool = pool;
    a.kind = kind;
    a.n = n_real_;
    be.audit_slots(a);
  }

 private:
  Layout layout_;
  KvDtype dtype_;
  ScaleRounding rounding_;
  int rows_, n_real_ = 0;
  int64_t ld_a_ = 0, ld_b_ = 0;
  Buf<uint8_t> pool_, flags_;
  Buf<int64_t> slots_;
  Buf<int32_t> n_real_buf_, errors_, mismatches_;
  Buf<float> a_, b_;
  Buf<uint64_t> digests_, audit_digests_;
};

constexpr SlotMix kMixes[] = {SlotMix::kValid,    SlotMix::kPadded,   SlotMix::kStaleTail,
                              SlotMix::kReserved, SlotMix::kBadSlots, SlotMix::kEverything};
constexpr int kRows[] = {1, 7, 64, 256};

struct DtypeVariant {
  KvDtype dtype;
  ScaleRounding rounding;
};
constexpr DtypeVariant kDtypes[] = {{KvDtype::kBf16, ScaleRounding::kExact},
                                    {KvDtype::kFp8, ScaleRounding::kExact},
                                    {KvDtype::kFp8, ScaleRounding::kUe8m0}};

class ParityStore : public ParityTest {
 protected:
  void check_layout(Layout layout) {
    int cases = 0;
    for (const auto& d : kDtypes) {
      for (int rows : kRows) {
        for (SlotMix mix : kMixes) {
          for (bool padded_stride : {false, true}) {
            StoreCase c({layout, d.dtype, d.rounding, rows, mix, padded_stride});
            EXPECT_TRUE(check_parity(c, cpu(), cuda(), 1000 + cases));
            ++cases;
          }
        }
      }
    }
    EXPECT_EQ(cases, 3 * 4 * 6 * 2);
  }
};

TEST_F(ParityStore, IndexKWholePoolMatchesCpu) { check_layout(Layout::kIndexK); }

TEST_F(ParityStore, LatentKvWholePoolMatchesCpu) { check_layout(Layout::kLatent); }

// The incident's unguarded scatter (bf16 index-K only) must be reproduced byte for byte too, and
// an fp8 pool must ignore the fault and stay guarded.
TEST_F(ParityStore, IncidentScatterMatchesCpu) {
  int cases = 0;
  for (const auto& d : kDtypes) {
    for (int rows : kRows) {
      for (SlotMix mix : kMixes) {
        StoreCase c(
            {Layout::kIndexK, d.dtype, d.rounding, rows, mix, false, StoreGuard::kIncidentScatter});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 5000 + cases));
        ++cases;
      }
    }
  }
}

TEST_F(ParityStore, DigestRowsAreTheDigestsOfTheStoredBytes) {
  int cases = 0;
  for (Layout layout : {Layout::kIndexK, Layout::kLatent}) {
    for (const auto& d : kDtypes) {
      for (int rows : {1, 7, 64, 256}) {
        DigestRowsCase c(layout, d.dtype, d.rounding, rows);
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 7000 + cases++));
      }
    }
  }
}

// Index-K keys given as bf16, every dtype, slot mix and stride: the bf16 pool keeps the bits, the
// fp8 pool quantizes their f32 widening, on both backends alike.
TEST_F(ParityStore, IndexKFromBf16KeysMatchesCpu) {
  int cases = 0;
  for (const auto& d : kDtypes) {
    for (int rows : kRows) {
      for (SlotMix mix : kMixes) {
        for (bool padded_stride : {false, true}) {
          StoreSpec spec{Layout::kIndexK, d.dtype, d.rounding, rows, mix, padded_stride};
          spec.bf16_keys = true;
          StoreCase c(spec);
          EXPECT_TRUE(check_parity(c, cpu(), cuda(), 9000 + cases));
          ++cases;
        }
      }
    }
  }
  StoreSpec incident{Layout::kIndexK,      KvDtype::kBf16, ScaleRounding::kExact,       64,
                     SlotMix::kEverything, false,          StoreGuard::kIncidentScatter};
  incident.bf16_keys = true;
  StoreCase c(incident);
  EXPECT_TRUE(check_parity(c, cpu(), cuda(), 9999));
}

// A batch of 1400 rows: the kernels' many-block path.
TEST_F(ParityStore, LargeBatchMatchesCpu) {
  for (Layout layout : {Layout::kIndexK, Layout::kLatent}) {
    for (const auto& d : kDtypes) {
      StoreCase c({layout, d.dtype, d.rounding, 1400, SlotMix::kEverything, false});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 77));
    }
  }
}

}  // namespace
}  // namespace dsa::parity
