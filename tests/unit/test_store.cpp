// The store contract of DESIGN §3 on the CPU backend, for every (layout, dtype): after each case
// the WHOLE pool must equal a snapshot plus exactly the slots that should change, and the error
// flag must rise by exactly the number of bad rows. Also the fp8 byte formula, and the incident
// reproduction of DESIGN §5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "dsa/backend.h"
#include "dsa/error.h"
#include "dsa/slot.h"
#include "dsa/token_codec.h"

namespace dsa {
namespace {

using ::dsa::testing::Rng;

using Layout = PoolKind;  // the library's: latent or index-K

struct PoolVariant {
  Layout layout;
  KvDtype dtype;
  ScaleRounding rounding = ScaleRounding::kExact;
  StoreGuard guard = StoreGuard::kEnforced;  // index-K only
};

std::string pool_variant_name(const PoolVariant& k) {
  std::string name = k.layout == Layout::kIndexK ? "IndexK" : "Latent";
  name += k.dtype == KvDtype::kBf16 ? "Bf16" : "Fp8";
  if (k.dtype == KvDtype::kFp8) name += k.rounding == ScaleRounding::kUe8m0 ? "Ue8m0" : "Exact";
  if (k.guard == StoreGuard::kIncidentScatter) name += "UnderIncidentGuard";
  return name;
}

constexpr int64_t kNumPages = 6;
constexpr int64_t kCapacity = kNumPages * kPageSize;
constexpr int64_t kInputPad = 8;  // extra floats per input row, filled with NaN: strides matter

// One store case: the slot map, n_real, and what must happen.
struct StoreCase {
  std::vector<int64_t> slots;  // [rows]
  int32_t n_real = 0;
  std::vector<std::pair<int, int64_t>> writes;  // (row, slot) pairs that must be written
  int32_t errors = 0;                           // rows that must raise the flag
};

// A pool in the CPU backend's memory, poisoned before each case, plus random input rows.
class StoreHarness {
 public:
  StoreHarness(const PoolVariant& kind, uint64_t seed)
      : kind_(kind), backend_(make_cpu_backend()), rng_(seed) {
    const int64_t page_bytes = kind.layout == Layout::kIndexK ? index_k_page_bytes(kind.dtype)
                                                              : latent_page_bytes(kind.dtype);
    bytes_ = kNumPages * page_bytes;
    memory_ = DeviceArray<uint8_t>(*backend_, size_t(bytes_));
    pool_ = PoolView{memory_.data(), kind.dtype, kind.rounding, kNumPages};
    page_bytes_ = page_bytes;
  }

  const PoolView& pool() const { return pool_; }
  int width() const { return kind_.layout == Layout::kIndexK ? kIndexHeadDim : kLatentDim; }

  // Random non-zero bytes everywhere except page 0, which stays zero as in a real cache.
  void poison() {
    std::fill(memory_.data(), memory_.data() + page_bytes_, uint8_t{0});
    for (int64_t i = page_bytes_; i < bytes_; ++i) {
      memory_.data()[i] = uint8_t(rng_.integer(1, 255));
    }
  }

  // [rows, width + kInputPad]: random normals, NaN in the padding of each row.
  std::vector<float> random_inputs(int rows, float stddev = 1.0f) {
    const int64_t ld = width() + kInputPad;
    std::vector<float> x(size_t(rows * ld), std::numeric_limits<float>::quiet_NaN());
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < width(); ++i) x[size_t(r * ld + i)] = rng_.normal(stddev);
    }
    return x;
  }

  // Runs the writer through the backend; returns the flag's rise.
  int32_t store(const std::vector<int64_t>& slots, int rows, int32_t n_real,
                const std::vector<float>& x, int32_t error_count_before = 0) {
    int32_t error_count = error_count_before;
    const SlotBatch batch{slots.data(), &n_real, rows, &error_count};
    const int64_t ld = width() + kInputPad;
    if (kind_.layout == Layout::kIndexK) {
      backend_->store_index_k(StoreIndexKParams{batch, x.data(), ld, pool_, kind_.guard});
    } else {
      StoreLatentKvParams p{batch, x.data(), x.data() + kKvLoraRank, ld, ld, pool_};
      backend_->store_latent_kv(p);
    }
    return error_count - error_count_before;
  }

  // The pool as it must be after `writes`: the current bytes, plus each write's encoding.
  std::vector<uint8_t> expected_after(const std::vector<std::pair<int, int64_t>>& writes,
                                      const std::vector<float>& x) const {
    std::vector<uint8_t> expected(memory_.data(), memory_.data() + bytes_);
    PoolView view = pool_;
    view.data = expected.data();
    const int64_t ld = width() + kInputPad;
    for (const auto& [row, slot] : writes) {
      const float* v = x.data() + row * ld;
      if (kind_.layout == Layout::kIndexK) {
        encode_index_k_token(view, slot, v);
      } else {
        encode_latent_token(view, slot, v, v + kKvLoraRank);
      }
    }
    return expected;
  }

  // Compares the whole pool with `expected`, naming the first differing slot.
  ::testing::AssertionResult pool_equals(const std::vector<uint8_t>& expected) const {
    int64_t differing = 0, first = -1;
    for (int64_t i = 0; i < bytes_; ++i) {
      if (memory_.data()[i] != expected[size_t(i)]) {
        if (first < 0) first = i;
        ++differing;
      }
    }
    if (differing == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << differing << " bytes differ; the first is byte "
                                         << first << " of slot " << slot_of_byte(first);
  }

  bool page_zero_is_zero() const {
    return std::all_of(memory_.data(), memory_.data() + page_bytes_,
                       [](uint8_t b) { return b == 0; });
  }

  // Runs a case from a fresh poison and checks the pool and the flag.
  void run(const StoreCase& c) {
    poison();
    const auto x = random_inputs(int(c.slots.size()));
    const auto expected = expected_after(c.writes, x);
    const int32_t errors = store(c.slots, int(c.slots.size()), c.n_real, x);
    EXPECT_TRUE(pool_equals(expected));
    EXPECT_EQ(errors, c.errors);
  }

  // Distinct slots outside page 0, in random order.
  std::vector<int64_t> valid_slots(int n) {
    std::vector<int64_t> all;
    for (int64_t s = kPageSize; s < kCapacity; ++s) all.push_back(s);
    std::shuffle(all.begin(), all.end(), rng_.gen());
    all.resize(size_t(n));
    return all;
  }

 private:
  int64_t slot_of_byte(int64_t offset) const {
    if (kind_.layout == Layout::kLatent) return offset / latent_token_bytes(kind_.dtype);
    if (kind_.dtype == KvDtype::kBf16) return offset / (kIndexHeadDim * 2);
    const int64_t page = offset / page_bytes_, within = offset % page_bytes_;
    const int64_t values = kPageSize * kIndexHeadDim;
    return page * kPageSize + (within < values ? within / kIndexHeadDim : (within - values) / 4);
  }

  PoolVariant kind_;
  std::unique_ptr<Backend> backend_;
  Rng rng_;
  DeviceArray<uint8_t> memory_;
  PoolView pool_;
  int64_t bytes_ = 0, page_bytes_ = 0;
};

// Writes for rows [0, n) of `slots`, skipping the rows listed in `skipped`.
std::vector<std::pair<int, int64_t>> writes_of(const std::vector<int64_t>& slots, int n,
                                               const std::vector<int>& skipped = {}) {
  std::vector<std::pair<int, int64_t>> w;
  for (int r = 0; r < n; ++r) {
    const bool skip = std::find(skipped.begin(), skipped.end(), r) != skipped.end();
    if (!skip) w.emplace_back(r, slots[size_t(r)]);
  }
  return w;
}

class StoreContract : public ::testing::TestWithParam<PoolVariant> {
 protected:
  StoreHarness h_{GetParam(), 20251202};
};

TEST_P(StoreContract, EveryRealRowWithAValidSlotIsWritten) {
  const auto slots = h_.valid_slots(8);
  h_.run({slots, 8, writes_of(slots, 8), 0});
}

TEST_P(StoreContract, PadSlotAtHeadMiddleAndTailIsSkippedSilently) {
  auto slots = h_.valid_slots(8);
  for (const int r : {0, 4, 7}) slots[size_t(r)] = kPadSlot;
  h_.run({slots, 8, writes_of(slots, 8, {0, 4, 7}), 0});
}

TEST_P(StoreContract, StaleTailPastNRealIsNotWritten) {
  // Rows 5..7 carry valid-looking slots of a previous step: they must not be written.
  const auto slots = h_.valid_slots(8);
  h_.run({slots, 5, writes_of(slots, 5), 0});
  // Nor flagged when their slots are garbage: a stale row is never examined further.
  auto garbage = slots;
  garbage[5] = -7;
  garbage[6] = kCapacity * 3;
  garbage[7] = std::numeric_limits<int64_t>::min();
  h_.run({garbage, 5, writes_of(garbage, 5), 0});
}

TEST_P(StoreContract, NRealOfZeroWritesNothing) {
  const auto slots = h_.valid_slots(4);
  h_.run({slots, 0, {}, 0});
}

TEST_P(StoreContract, ReservedPageIsNeverWritten) {
  auto slots = h_.valid_slots(6);
  slots[1] = 0;
  slots[3] = 1;
  slots[5] = kPageSize - 1;
  h_.run({slots, 6, writes_of(slots, 6, {1, 3, 5}), 0});
  EXPECT_TRUE(h_.page_zero_is_zero());
}

TEST_P(StoreContract, SlotsPastCapacityAreSkippedAndFlagged) {
  auto slots = h_.valid_slots(6);
  slots[0] = kCapacity;
  slots[2] = kCapacity + 1;
  slots[5] = std::numeric_limits<int64_t>::max();
  h_.run({slots, 6, writes_of(slots, 6, {0, 2, 5}), 3});
}

TEST_P(StoreContract, NegativeSlotsOtherThanPadAreSkippedAndFlagged) {
  auto slots = h_.valid_slots(6);
  slots[0] = -2;
  slots[3] = std::numeric_limits<int64_t>::min();
  slots[4] = -kCapacity;
  h_.run({slots, 6, writes_of(slots, 6, {0, 3, 4}), 3});
}

TEST_P(StoreContract, MixedBatchFlagsExactlyItsBadRealRows) {
  auto slots = h_.valid_slots(12);
  slots[0] = kPadSlot;
  slots[2] = 5;                // page 0
  slots[3] = -2;               // flagged
  slots[6] = kCapacity + 100;  // flagged
  slots[8] = kPadSlot;
  slots[10] = -3;         // stale: not flagged
  slots[11] = kCapacity;  // stale: not flagged
  h_.run({slots, 10, writes_of(slots, 10, {0, 2, 3, 6, 8}), 2});
  EXPECT_TRUE(h_.page_zero_is_zero());
}

TEST_P(StoreContract, RowCountIsTheSlotMapsNotTheValueTensors) {
  // Values and slots exist for 8 rows, n_real says 8, but the slot map of this step is 5 long.
  h_.poison();
  const auto slots = h_.valid_slots(8);
  const auto x = h_.random_inputs(8);
  const auto expected = h_.expected_after(writes_of(slots, 5), x);
  EXPECT_EQ(h_.store(slots, 5, 8, x), 0);
  EXPECT_TRUE(h_.pool_equals(expected));
}

TEST_P(StoreContract, ErrorCountAccumulatesAcrossCalls) {
  h_.poison();
  auto slots = h_.valid_slots(3);
  slots[1] = -5;
  const auto x = h_.random_inputs(3);
  EXPECT_EQ(h_.store(slots, 3, 3, x, /*error_count_before=*/7), 1);
}

INSTANTIATE_TEST_SUITE_P(
    , StoreContract,
    ::testing::Values(PoolVariant{Layout::kIndexK, KvDtype::kBf16},
                      PoolVariant{Layout::kIndexK, KvDtype::kFp8},
                      PoolVariant{Layout::kIndexK, KvDtype::kFp8, ScaleRounding::kUe8m0},
                      // The fault reaches the bf16 layout only: fp8 enforces every rule under it.
                      PoolVariant{Layout::kIndexK, KvDtype::kFp8, ScaleRounding::kExact,
                                  StoreGuard::kIncidentScatter},
                      PoolVariant{Layout::kLatent, KvDtype::kBf16},
                      PoolVariant{Layout::kLatent, KvDtype::kFp8},
                      PoolVariant{Layout::kLatent, KvDtype::kFp8, ScaleRounding::kUe8m0}),
    [](const ::testing::TestParamInfo<PoolVariant>& p) { return pool_variant_name(p.param); });

// ---- the fp8 bytes, checked against DESIGN §3 independently of dtype.h and token_codec.h -------

// The magnitude of e4m3fn code c in [0, 0x7E], from the format's definition (bias 7, 3-bit man).
double e4m3_magnitude(int code) {
  const int exp = code >> 3, man = code & 7;
  return exp == 0 ? std::ldexp(man, -9) : std::ldexp(8 + man, exp - 10);
}

// The e4m3 byte DESIGN §3 asks for: nearest to t, ties to even, saturated to +-448.
uint8_t expected_e4m3(float t) {
  const double a = std::fabs(double(t));
  int best = 0;
  for (int code = 1; code <= 0x7E; ++code) {
    const double d = std::fabs(e4m3_magnitude(code) - a),
                 best_d = std::fabs(e4m3_magnitude(best) - a);
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  return uint8_t((std::signbit(t) ? 0x80 : 0) | best);
}

// scale = max(amax, 1e-4) / 448, for ue8m0 rounded up to a power of two.
float expected_scale(const float* x, int n, ScaleRounding rounding) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  float scale = std::max(amax, 1e-4f) / 448.0f;
  if (rounding == ScaleRounding::kUe8m0) {
    int exp = 0;
    if (std::frexp(scale, &exp) != 0.5f) scale = std::ldexp(1.0f, exp);
  }
  return scale;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Checks one fp8 group: the scale bit for bit, every byte, and the dequantized values against
// the input within e4m3 precision (half an ulp: 2^-4 relative, or 2^-10 * scale when subnormal).
void expect_fp8_group(const float* x, int n, const uint8_t* codes, float scale,
                      ScaleRounding rounding) {
  const float want_scale = expected_scale(x, n, rounding);
  ASSERT_EQ(bits_of(scale), bits_of(want_scale)) << scale << " vs " << want_scale;
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(int(codes[i]), int(expected_e4m3(x[i] / want_scale))) << "element " << i;
    ASSERT_LE(codes[i] & 0x7F, 0x7E) << "element " << i << " is NaN";
    const double value = (codes[i] & 0x80 ? -1 : 1) * e4m3_magnitude(codes[i] & 0x7F) * scale;
    const double tolerance = std::max(std::fabs(x[i]) / 16.0, std::ldexp(double(scale), -10));
    ASSERT_LE(std::fabs(value - x[i]), tolerance * (1 + 1e-6)) << "element " << i;
  }
}

// Row stddevs that exercise the 1e-4 floor of the scale, ordinary values, and large ones.
constexpr float kRowScales[] = {1e-6f, 1.0f, 0.02f, 900.0f};

class StoreFp8 : public ::testing::TestWithParam<ScaleRounding> {};

TEST_P(StoreFp8, IndexKBytesFollowTheDesignFormula) {
  StoreHarness h({Layout::kIndexK, KvDtype::kFp8, GetParam()}, 7);
  h.poison();
  const auto slots = h.valid_slots(4);
  std::vector<float> x;
  for (const float stddev : kRowScales) {
    const auto row = h.random_inputs(1, stddev);
    x.insert(x.end(), row.begin(), row.end());
  }
  ASSERT_EQ(h.store(slots, 4, 4, x), 0);
  const int64_t ld = kIndexHeadDim + kInputPad, page_bytes = kPageSize * (kIndexHeadDim + 4);
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const int64_t page = slots[size_t(r)] / kPageSize, off = slots[size_t(r)] % kPageSize;
    const uint8_t* codes = h.pool().data + page * page_bytes + off * kIndexHeadDim;
    float scale;
    std::memcpy(&scale, h.pool().data + page * page_bytes + kPageSize * kIndexHeadDim + off * 4, 4);
    expect_fp8_group(x.data() + r * ld, kIndexHeadDim, codes, scale, GetParam());
  }
  EXPECT_EQ(bits_of(expected_scale(x.data(), kIndexHeadDim, ScaleRounding::kExact)),
            bits_of(1e-4f / 448.0f));  // the first row really sits below the floor
}

TEST_P(StoreFp8, LatentBytesFollowTheDesignFormula) {
  StoreHarness h({Layout::kLatent, KvDtype::kFp8, GetParam()}, 8);
  h.poison();
  const auto slots = h.valid_slots(4);
  std::vector<float> x;
  for (const float stddev : kRowScales) {
    auto row = h.random_inputs(1, stddev);
    for (int t = 1; t < 4; ++t) {  // give each 128-value tile its own magnitude
      for (int i = 0; i < kLatentTile; ++i) row[size_t(t * kLatentTile + i)] *= float(1 << (3 * t));
    }
    x.insert(x.end(), row.begin(), row.end());
  }
  ASSERT_EQ(h.store(slots, 4, 4, x), 0);
  const int64_t ld = kLatentDim + kInputPad;
  for (int r = 0; r < 4; ++r) {
    const uint8_t* token = h.pool().data + slots[size_t(r)] * 656;
    const float* in = x.data() + r * ld;
    for (int t = 0; t < 4; ++t) {
      SCOPED_TRACE("row " + std::to_string(r) + " tile " + std::to_string(t));
      float scale;
      std::memcpy(&scale, token + 512 + 4 * t, 4);
      expect_fp8_group(in + t * kLatentTile, kLatentTile, token + t * kLatentTile, scale,
                       GetParam());
    }
    for (int i = 0; i < kRopeDim; ++i) {  // k_rope stays bf16: the nearest bf16 to the input
      uint16_t b;
      std::memcpy(&b, token + 528 + 2 * i, 2);
      const double v = float_of(uint32_t(b) << 16), target = in[kKvLoraRank + i];
      EXPECT_LE(std::fabs(v - target), std::fabs(float_of(uint32_t(b + 1) << 16) - target));
      EXPECT_LE(std::fabs(v - target), std::fabs(float_of(uint32_t(b - 1) << 16) - target));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, StoreFp8,
                         ::testing::Values(ScaleRounding::kExact, ScaleRounding::kUe8m0),
                         [](const ::testing::TestParamInfo<ScaleRounding>& p) {
                           return p.param == ScaleRounding::kExact ? "Exact" : "Ue8m0";
                         });

// ---- the incident reproduction (DESIGN §5, fault `unguarded-store`) ----------------------------

// A batch like the incident's: 5 real rows in a bucket of 9, with pads, a page-0 slot, and slots
// that are bad even for a framework scatter.
struct IncidentBatch {
  std::vector<int64_t> slots;
  int32_t n_real = 5;
};
IncidentBatch incident_batch(StoreHarness& h) {
  const auto valid = h.valid_slots(4);
  return {{valid[0], kPadSlot, 3, -2, valid[1],                  // real rows
           valid[2], kPadSlot, -kCapacity - 1, kCapacity + 5}};  // stale tail
}

TEST(StoreIncident, UnguardedBf16IndexKClobbersWhatTheIncidentClobbered) {
  StoreHarness h(
      {Layout::kIndexK, KvDtype::kBf16, ScaleRounding::kExact, StoreGuard::kIncidentScatter}, 11);
  const IncidentBatch b = incident_batch(h);
  h.poison();
  const auto x = h.random_inputs(9);
  const auto before = h.expected_after({}, x);
  // In row order, as a scatter applies them: -1 wraps to the pool's LAST slot (a live token of
  // some other request), -2 to the one before it; page 0 and the stale tail are written too.
  const std::vector<std::pair<int, int64_t>> writes = {
      {0, b.slots[0]}, {1, kCapacity - 1}, {2, 3}, {3, kCapacity - 2}, {4, b.slots[4]},
      {5, b.slots[5]}, {6, kCapacity - 1}};
  const auto expected = h.expected_after(writes, x);
  // -kCapacity-1 still falls outside the pool after wrapping, kCapacity never wraps: 2 flags.
  EXPECT_EQ(h.store(b.slots, 9, b.n_real, x), 2);
  EXPECT_TRUE(h.pool_equals(expected));

  // Spelled out, so that the reproduction cannot quietly stop reproducing.
  const PoolView& pool = h.pool();
  const auto slot_holds_row = [&](int64_t slot, int row) {
    float decoded[kIndexHeadDim];
    decode_index_k_token(pool, slot, decoded);
    for (int i = 0; i < kIndexHeadDim; ++i) {
      if (decoded[i] != round_bf16(x[size_t(row * (kIndexHeadDim + kInputPad) + i)])) return false;
    }
    return true;
  };
  EXPECT_TRUE(slot_holds_row(kCapacity - 1, 6)) << "the pad row did not clobber the last slot";
  EXPECT_TRUE(slot_holds_row(b.slots[5], 5)) << "the stale-tail row was not written";
  EXPECT_TRUE(slot_holds_row(3, 2)) << "page 0 was not written";
  EXPECT_FALSE(h.page_zero_is_zero());
  EXPECT_NE(0, std::memcmp(before.data() + (kCapacity - 1) * kIndexHeadDim * 2,
                           pool.data + (kCapacity - 1) * kIndexHeadDim * 2, kIndexHeadDim * 2));
}

TEST(StoreIncident, TheSameBatchIsHarmlessUnderTheGuard) {
  // The guarded bf16 writer, and the fp8 writer even with the fault on, write rows 0 and 4 only.
  for (const auto& kind : {PoolVariant{Layout::kIndexK, KvDtype::kBf16},
                           PoolVariant{Layout::kIndexK, KvDtype::kFp8, ScaleRounding::kExact,
                                       StoreGuard::kIncidentScatter},
                           PoolVariant{Layout::kIndexK, KvDtype::kFp8, ScaleRounding::kUe8m0,
                                       StoreGuard::kIncidentScatter}}) {
    SCOPED_TRACE(pool_variant_name(kind));
    StoreHarness h(kind, 12);
    const IncidentBatch b = incident_batch(h);
    h.run({b.slots, b.n_real, {{0, b.slots[0]}, {4, b.slots[4]}}, /*errors=*/1});  // the -2
    EXPECT_TRUE(h.page_zero_is_zero());
  }
}

// Index keys given as bf16 (StoreIndexKParams::k_bf16): the whole pool and the error count equal
// those of the float32 store of their exact widening, under the rules (pad, page 0, a slot past
// capacity, a stale tail); a bf16 pool keeps the bits as given, NaN payloads included.
TEST(StoreBf16Keys, AreTheBytesOfTheirExactWidening) {
  constexpr int64_t kPages = 4, kRows = 6;
  const std::vector<int64_t> slots = {64, -1, 3, kPages * kPageSize, 130, 200};  // n_real 5
  Rng rng(11);
  const int64_t ld = kIndexHeadDim + 2;
  std::vector<Bf16> k16(size_t(kRows * ld));
  for (auto& b : k16) b = float_to_bf16(rng.normal(20.0f));
  k16[0].bits = 0x7FC1;           // a NaN with a payload
  k16[4 * ld + 1].bits = 0x0001;  // a subnormal
  std::vector<float> wide(k16.size());
  for (size_t i = 0; i < k16.size(); ++i) wide[i] = bf16_to_float(k16[i]);
  const auto backend = make_cpu_backend();
  for (const auto& [dtype, rounding] : {std::pair{KvDtype::kBf16, ScaleRounding::kExact},
                                        {KvDtype::kFp8, ScaleRounding::kExact},
                                        {KvDtype::kFp8, ScaleRounding::kUe8m0}}) {
    SCOPED_TRACE(std::string(kv_dtype_name(dtype)));
    std::vector<uint8_t> from16(size_t(kPages * index_k_page_bytes(dtype)), 0xA5);
    std::vector<uint8_t> from32 = from16;
    int32_t n_real = 5, errors16 = 0, errors32 = 0;
    StoreIndexKParams p;
    p.batch = {slots.data(), &n_real, int(kRows), &errors16};
    p.ld_k = ld;
    p.pool = {from16.data(), dtype, rounding, kPages};
    p.k_bf16 = k16.data();
    backend->store_index_k(p);
    p.k_bf16 = nullptr;
    p.k = wide.data();
    p.batch.error_count = &errors32;
    p.pool.data = from32.data();
    if (dtype == KvDtype::kBf16) {
      backend->store_index_k(p);  // rounds the NaN to the canonical 0x7FFF: compare it apart
      Bf16 stored;
      std::memcpy(&stored, from16.data() + 64 * kIndexHeadDim * 2, 2);
      EXPECT_EQ(stored.bits, 0x7FC1);
      std::memcpy(from32.data() + 64 * kIndexHeadDim * 2, &stored, 2);
    } else {
      backend->store_index_k(p);
    }
    EXPECT_EQ(errors16, 1);
    EXPECT_EQ(errors32, 1);
    EXPECT_EQ(from16, from32);
    EXPECT_NE(from16, std::vector<uint8_t>(from16.size(), 0xA5));
  }
  StoreIndexKParams both;
  int32_t n_real = 1, errors = 0;
  std::vector<uint8_t> pool(size_t(kPages * index_k_page_bytes(KvDtype::kBf16)));
  both.batch = {slots.data(), &n_real, 1, &errors};
  both.ld_k = ld;
  both.pool = {pool.data(), KvDtype::kBf16, ScaleRounding::kExact, kPages};
  both.k = wide.data();
  both.k_bf16 = k16.data();
  EXPECT_THROW(backend->store_index_k(both), Error);
}

}  // namespace
}  // namespace dsa
