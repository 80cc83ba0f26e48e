// Parity of the fused ops, each by definition a composition of existing ops:
//   indexer_key   = layernorm -> rope -> hadamard -> store_index_k   (the indexer's key path)
//   latent_kv     = rmsnorm -> rope -> store_latent_kv               (the MLA's latent path)
//   indexer_query = rope -> hadamard                                 (the indexer's query path)
// For the two that store, per case (every cache dtype and fp8 scale rounding, in place or not,
// 16-byte or element-wise rows, slot maps with pads, a stale tail, reserved and out-of-pool slots,
// positions outside the table):
//   - CUDA's fused kernel gives the bytes of the CUDA ops run one after another (values, the WHOLE
//     pool, the error flag), and the same bytes on a second run;
//   - its values match the CPU reference (the composition of the CPU ops) within the norm's
//     reduction-order tolerance, per row;
//   - the CPU's writer, given CUDA's values, leaves the WHOLE pool byte-identical to the fused
//     kernel's pool and counts the same errors: no slot outside the batch's judged rows changed,
//     and every written token is the writer's encoding;
//   - guards around every buffer are intact on both sides (outputs start poisoned).
// Batch invariance: a row's values and stored token are the same bits alone, among 7, 64 and 256.
// indexer_query is exact (rope and hadamard are), so it goes through the harness's exact check.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "dsa/slot.h"
#include "dsa/token_codec.h"
#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

constexpr int64_t kPages = 24;  // capacity 1536 slots: room for 256 distinct valid slots
constexpr int64_t kCapacity = kPages * kPageSize;
constexpr int kMaxPosition = 300;
constexpr double kNormNmse = 1e-10;  // the norm's sums in another order

std::vector<float> rope_table() { return rope_test_table(kMaxPosition, kRopeDim); }

// ---- the fused ops that store: indexer_key and latent_kv ----

enum class Op { kIndexKey, kLatentKv };
enum class Slots { kValid, kMixed, kIncident };

struct FusedSpec {
  Op op;
  KvDtype dtype;
  ScaleRounding rounding;
  RopeStyle style;  // indexer_key only (latent_kv's rope is interleaved)
  int rows;
  bool in_place;       // indexer_key only (latent_kv works in place)
  bool padded_stride;  // row strides that are not a multiple of 4 floats: the element-wise path
  Slots slots;
};

std::string spec_name(const FusedSpec& s) {
  std::string v = s.op == Op::kIndexKey ? "indexer_key" : "latent_kv";
  v += std::string(" dtype=") + kv_dtype_name(s.dtype);
  if (s.dtype == KvDtype::kFp8) v += s.rounding == ScaleRounding::kUe8m0 ? "/ue8m0" : "/exact";
  if (s.op == Op::kIndexKey) {
    v += s.style == RopeStyle::kInterleaved ? ",interleaved" : ",half_split";
    if (s.in_place) v += ",in_place";
  }
  v += ",rows=" + std::to_string(s.rows);
  if (s.padded_stride) v += ",padded_stride";
  v += s.slots == Slots::kValid ? ",slots=valid"
                                : (s.slots == Slots::kMixed ? ",slots=mixed" : ",incident");
  return v;
}

class StoreFusedCase final : public OpCase {
 public:
  enum class Mode {
    kFused,      // the fused op
    kComposed,   // its parts, one op after another
    kStoreOnly,  // only the store, from `values` written into the value buffer first
  };
  explicit StoreFusedCase(FusedSpec spec) : s_(spec) {}
  std::string name() const override { return s_.op == Op::kIndexKey ? "indexer_key" : "latent_kv"; }
  std::string vars() const override { return spec_name(s_); }
  Mode mode = Mode::kFused;
  std::vector<uint8_t> values;  // kStoreOnly: the bytes of the value buffer to store from

  bool key() const { return s_.op == Op::kIndexKey; }
  int width() const { return key() ? kIndexHeadDim : kLatentDim; }
  int64_t ld_out() const { return ld_out_; }
  const std::vector<int64_t>& slot_values() const { return slot_values_; }

  void init(Workspace& ws, testing::Rng& rng) override {
    // Batch-independent: weights, angles, the pool's bytes, the order of valid slots.
    const int norm_dim = key() ? kIndexHeadDim : kKvLoraRank;
    norm_w_ = ws.input(rng.bf16s(size_t(norm_dim)));
    norm_b_ = ws.input(rng.bf16s(size_t(norm_dim), 0.5f));
    table_ = ws.input(rope_table());
    const int64_t page_bytes = key() ? index_k_page_bytes(s_.dtype) : latent_page_bytes(s_.dtype);
    std::vector<uint8_t> pool(size_t(kPages * page_bytes));
    for (auto& b : pool) b = uint8_t(rng.integer(1, 255));
    std::vector<int64_t> order(size_t(kCapacity - 2 * kPageSize));  // never the last page
    std::iota(order.begin(), order.end(), int64_t(kPageSize));
    std::shuffle(order.begin(), order.end(), rng.gen());

    // Per row, in row order: values, position, slot.
    const bool in_place = s_.in_place || !key();
    ld_in_ = width() + (s_.padded_stride ? 3 : 4);
    ld_out_ = in_place ? ld_in_ : width() + (s_.padded_stride ? 1 : 8);
    static constexpr float kMagnitudes[] = {1.0f, 300.0f, 3e-3f, 2e-5f, 1e4f, 0.7f};
    std::vector<float> x(size_t(s_.rows) * ld_in_);
    std::vector<int32_t> positions(s_.rows);
    std::vector<int64_t> slots(s_.rows);
    for (int r = 0; r < s_.rows; ++r) {
      const float mag = kMagnitudes[rng.integer(0, 5)];
      const float mean = rng.uniform(-2, 2) * mag;
      for (int64_t i = 0; i < ld_in_; ++i) x[r * ld_in_ + i] = mean + rng.normal(mag);
      positions[r] = int32_t(rng.integer(-2, kMaxPosition + 2));  // some out of range
      slots[r] = order[size_t(r)];
      if (s_.slots == Slots::kMixed) {
        if (r % 5 == 1) slots[r] = kPadSlot;
        if (r % 7 == 3) slots[r] = r % 2 ? kCapacity + r : -2 - r;
        if (r % 11 == 4) slots[r] = r % kPageSize;  // the reserved page
      }
    }
    int32_t n_real = s_.rows;
    if (s_.slots == Slots::kMixed) n_real = s_.rows - s_.rows / 4;  // a stale tail
    if (s_.slots == Slots::kIncident) slots[0] = kPadSlot;          // wraps to the last slot, alone
    const Check check = Check::nmse(kNormNmse).per_row(ld_out_);
    if (in_place) {
      in_ = ws.inout(x, check, RowLayout::kRowMajor);
      out_ = in_;
    } else {
      in_ = ws.input(x);
      out_ = ws.output<float>(size_t(s_.rows) * ld_out_, check);
    }
    pool_ = ws.inout(pool, Check::exact());
    errors_ = ws.inout(std::vector<int32_t>{3}, Check::exact());
    positions_ = ws.input(positions);
    slots_ = ws.input(slots);
    n_real_ = ws.input(std::vector<int32_t>{n_real});
    slot_values_ = slots;
  }

  void run(Workspace& ws, Side side) override {
    Backend& be = ws.backend(side);
    const SlotBatch batch{ws.ptr(slots_, side), ws.ptr(n_real_, side), s_.rows,
                          ws.ptr(errors_, side)};
    const PoolView pool{ws.ptr(pool_, side), s_.dtype, s_.rounding, kPages};
    if (mode == Mode::kStoreOnly)
      be.copy_to_device(ws.ptr(out_, side), values.data(), values.size());
    if (key()) {
      IndexerKeyParams p;
      p.x = ws.ptr(in_, side);
      p.k = ws.ptr(out_, side);
      p.ld_x = ld_in_;
      p.ld_k = ld_out_;
      p.norm_weight = ws.ptr(norm_w_, side);
      p.norm_bias = ws.ptr(norm_b_, side);
      p.eps = 1e-6f;
      p.positions = ws.ptr(positions_, side);
      p.cos_sin = ws.ptr(table_, side);
      p.max_position = kMaxPosition;
      p.style = s_.style;
      p.hadamard_scale = float(1.0 / std::sqrt(double(kIndexHeadDim)));
      p.batch = batch;
      p.pool = pool;
      p.guard = s_.slots == Slots::kIncident ? StoreGuard::kIncidentScatter : StoreGuard::kEnforced;
      const IndexerKeyParts parts = indexer_key_parts(p);
      if (mode == Mode::kFused) {
        be.indexer_key(p);
      } else if (mode == Mode::kComposed) {
        be.layernorm(parts.norm);
        be.rope(parts.rope);
        be.hadamard(parts.hadamard);
        be.store_index_k(parts.store);
      } else {
        be.store_index_k(parts.store);
      }
    } else {
      LatentKvParams p;
      p.kv = ws.ptr(out_, side);
      p.ld_kv = ld_out_;
      p.norm_weight = ws.ptr(norm_w_, side);
      p.eps = 1e-6f;
      p.positions = ws.ptr(positions_, side);
      p.cos_sin = ws.ptr(table_, side);
      p.max_position = kMaxPosition;
      p.batch = batch;
      p.pool = pool;
      const LatentKvParts parts = latent_kv_parts(p);
      if (mode == Mode::kFused) {
        be.latent_kv(p);
      } else if (mode == Mode::kComposed) {
        be.rmsnorm(parts.norm);
        be.rope(parts.rope);
        be.store_latent_kv(parts.store);
      } else {
        be.store_latent_kv(parts.store);
      }
    }
  }

 private:
  FusedSpec s_;
  int64_t ld_in_ = 0, ld_out_ = 0;
  Buf<Bf16> norm_w_, norm_b_;
  Buf<float> table_, in_, out_;
  Buf<uint8_t> pool_;
  Buf<int32_t> errors_, positions_, n_real_;
  Buf<int64_t> slots_;
  std::vector<int64_t> slot_values_;
};

// Outputs, in the case's declaration order.
constexpr size_t kValues = 0, kPool = 1, kErrors = 2;

// The stored bytes of the token at `slot` (values, then the fp8 scales).
std::vector<uint8_t> token_bytes(const FusedSpec& s, std::vector<uint8_t>& pool, int64_t slot) {
  const PoolView view{pool.data(), s.dtype, s.rounding, kPages};
  if (s.op == Op::kLatentKv) {
    const uint8_t* t = latent_token(view, slot);
    return {t, t + latent_token_bytes(s.dtype)};
  }
  const uint8_t* v = index_k_values(view, slot);
  std::vector<uint8_t> out(v, v + (s.dtype == KvDtype::kBf16 ? 2 : 1) * kIndexHeadDim);
  if (s.dtype == KvDtype::kFp8) {
    const auto* scale = reinterpret_cast<const uint8_t*>(index_k_scale(view, slot));
    out.insert(out.end(), scale, scale + sizeof(float));
  }
  return out;
}

class ParityFused : public ParityTest {
 protected:
  void check(const FusedSpec& spec) {
    SCOPED_TRACE(spec_name(spec));
    Workspace ws(cpu(), cuda());
    testing::Rng rng(900 + spec.rows);
    StoreFusedCase c(spec);
    c.init(ws, rng);
    c.mode = StoreFusedCase::Mode::kFused;
    const auto fused = run_side(c, ws, Side::kCuda);
    const auto again = run_side(c, ws, Side::kCuda);
    const auto reference = run_side(c, ws, Side::kCpu);  // the CPU's default: the composition
    c.mode = StoreFusedCase::Mode::kComposed;
    const auto composed = run_side(c, ws, Side::kCuda);
    c.mode = StoreFusedCase::Mode::kStoreOnly;
    c.values = fused.outputs[kValues];
    const auto written = run_side(c, ws, Side::kCpu);

    for (const auto* rb : {&fused, &again, &reference, &composed, &written}) {
      EXPECT_EQ(rb->guard_report, "");
    }
    ASSERT_EQ(fused.outputs.size(), 3u);
    for (size_t i = 0; i < fused.outputs.size(); ++i) {
      EXPECT_TRUE(fused.outputs[i] == composed.outputs[i])
          << "output " << i << ": the fused kernel differs from its ops run one by one";
      EXPECT_TRUE(fused.outputs[i] == again.outputs[i]) << "output " << i << ": a rerun differs";
    }
    EXPECT_EQ(compare_output(reference.outputs[kValues], fused.outputs[kValues],
                             Check::nmse(kNormNmse).per_row(c.ld_out())),
              "");
    EXPECT_TRUE(written.outputs[kPool] == fused.outputs[kPool])
        << "the CPU writer on CUDA's values leaves another pool";
    EXPECT_EQ(written.outputs[kErrors], fused.outputs[kErrors]);
    EXPECT_EQ(reference.outputs[kErrors], fused.outputs[kErrors]);
  }

  // A row's values and stored token are the same bits whatever the batch around it.
  void check_invariance(FusedSpec spec) {
    SCOPED_TRACE(spec_name(spec));
    const std::vector<int> sizes = {1, 7, 64, 256};
    std::vector<std::vector<uint8_t>> values, pools;
    std::vector<int64_t> slots;
    int64_t ld = 0;
    for (int rows : sizes) {
      Workspace ws(cpu(), cuda());
      testing::Rng rng(31);
      spec.rows = rows;
      StoreFusedCase c(spec);
      c.init(ws, rng);
      const auto rb = run_side(c, ws, Side::kCuda);
      ASSERT_EQ(rb.guard_report, "");
      values.push_back(rb.outputs[kValues]);
      pools.push_back(rb.outputs[kPool]);
      slots = c.slot_values();  // prefixes agree: the largest case's map
      ld = c.ld_out();
    }
    const size_t row_bytes = size_t(ld) * sizeof(float);
    for (size_t a = 1; a < sizes.size(); ++a) {
      for (int r = 0; r < sizes[a - 1]; ++r) {
        EXPECT_TRUE(std::equal(values[a].begin() + r * row_bytes,
                               values[a].begin() + (r + 1) * row_bytes,
                               values[a - 1].begin() + r * row_bytes))
            << "row " << r << "'s values differ between " << sizes[a - 1] << " and " << sizes[a]
            << " rows";
        EXPECT_EQ(token_bytes(spec, pools[a - 1], slots[r]), token_bytes(spec, pools[a], slots[r]))
            << "row " << r << "'s token differs between " << sizes[a - 1] << " and " << sizes[a]
            << " rows";
      }
    }
  }
};

struct Encoding {
  KvDtype dtype;
  ScaleRounding rounding;
};
constexpr Encoding kEncodings[] = {{KvDtype::kBf16, ScaleRounding::kExact},
                                   {KvDtype::kFp8, ScaleRounding::kExact},
                                   {KvDtype::kFp8, ScaleRounding::kUe8m0}};

TEST_F(ParityFused, IndexerKeyIsItsOps) {
  for (const Encoding e : kEncodings) {
    for (RopeStyle style : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
      for (int rows : {1, 7, 64, 256}) {
        check({Op::kIndexKey, e.dtype, e.rounding, style, rows, /*in_place=*/rows % 2 == 1,
               /*padded_stride=*/false, Slots::kMixed});
      }
      check({Op::kIndexKey, e.dtype, e.rounding, style, 33, false, true, Slots::kMixed});
      check({Op::kIndexKey, e.dtype, e.rounding, style, 20, true, true, Slots::kValid});
    }
  }
  // The incident's scatter applies to bf16 (fp8 stays guarded, as store_index_k does).
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    check({Op::kIndexKey, dtype, ScaleRounding::kExact, RopeStyle::kHalfSplit, 9, false, false,
           Slots::kIncident});
  }
}

TEST_F(ParityFused, LatentKvIsItsOps) {
  for (const Encoding e : kEncodings) {
    for (int rows : {1, 7, 64, 256}) {
      check({Op::kLatentKv, e.dtype, e.rounding, RopeStyle::kInterleaved, rows, true,
             /*padded_stride=*/false, Slots::kMixed});
    }
    check({Op::kLatentKv, e.dtype, e.rounding, RopeStyle::kInterleaved, 33, true, true,
           Slots::kMixed});
  }
}

TEST_F(ParityFused, StoringOpsAreBatchInvariant) {
  for (const Encoding e : kEncodings) {
    check_invariance({Op::kIndexKey, e.dtype, e.rounding, RopeStyle::kHalfSplit, 0, false, false,
                      Slots::kValid});
    check_invariance({Op::kLatentKv, e.dtype, e.rounding, RopeStyle::kInterleaved, 0, true, false,
                      Slots::kValid});
  }
}

// ---- indexer_query: exact, through the harness ----

class IndexerQueryCase final : public OpCase {
 public:
  // pad: floats past the packed heads in each row (a row stride of heads * 128 + pad, as the
  // model's fused projection output has), which must stay as they were.
  // fp8: the op also writes the query's fp8 encoding (q_fp8, at a row stride 16 bytes past the
  // packed heads, which must stay poison) and its scales, compared byte for byte.
  IndexerQueryCase(RopeStyle style, int rows, int heads, bool composed, int pad = 0,
                   bool fp8 = false)
      : style_(style), rows_(rows), heads_(heads), composed_(composed), pad_(pad), fp8_(fp8) {}
  std::string name() const override { return "indexer_query"; }
  std::string vars() const override {
    return std::string(style_ == RopeStyle::kInterleaved ? "interleaved" : "half_split") +
           ",rows=" + std::to_string(rows_) + ",heads=" + std::to_string(heads_) +
           (composed_ ? ",composed" : "") + (pad_ ? ",pad=" + std::to_string(pad_) : "") +
           (fp8_ ? ",fp8" : "");
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    table_ = ws.input(rope_table());
    const int64_t ld = int64_t(heads_) * kIndexHeadDim + pad_;
    std::vector<int32_t> positions(rows_);
    std::vector<float> q(size_t(rows_) * ld);
    for (int r = 0; r < rows_; ++r) {
      positions[r] = int32_t(rng.integer(-2, kMaxPosition + 2));
      for (int64_t i = 0; i < ld; ++i) q[r * ld + i] = rng.normal(2.0f);
    }
    positions_ = ws.input(positions);
    q_ = ws.inout(q, Check::exact(), RowLayout::kRowMajor);
    if (fp8_) {
      q8_ = ws.output<uint8_t>(size_t(rows_) * ld8(), Check::exact());
      scale_ = ws.output<float>(size_t(rows_) * heads_, Check::exact());
    }
  }
  int64_t ld8() const { return int64_t(heads_) * kIndexHeadDim + 16; }
  void run(Workspace& ws, Side side) override {
    IndexerQueryParams p{ws.ptr(q_, side),
                         int64_t(heads_) * kIndexHeadDim + pad_,
                         rows_,
                         heads_,
                         ws.ptr(positions_, side),
                         ws.ptr(table_, side),
                         kMaxPosition,
                         style_,
                         float(1.0 / std::sqrt(double(kIndexHeadDim)))};
    Backend& be = ws.backend(side);
    if (fp8_) {
      p.q_fp8 = ws.ptr(q8_, side);
      p.q_fp8_scale = ws.ptr(scale_, side);
      p.ld_q_fp8 = ld8();
    }
    if (!composed_) {
      be.indexer_query(p);
      return;
    }
    const IndexerQueryParts parts = indexer_query_parts(p);
    be.rope(parts.rope);
    for (int r = 0; r < (pad_ ? rows_ : 1); ++r) {  // padded rows: the hadamard part per row
      HadamardParams h = parts.hadamard;
      h.x += r * p.ld_q;
      be.hadamard(h);
    }
  }

 private:
  RopeStyle style_;
  int rows_, heads_;
  bool composed_;
  int pad_;
  bool fp8_;
  Buf<float> table_, q_, scale_;
  Buf<uint8_t> q8_;
  Buf<int32_t> positions_;
};

// The fused kernel and the two CUDA ops both give the CPU's bits, at every batch size.
TEST_F(ParityFused, IndexerQueryIsItsOps) {
  for (RopeStyle style : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
    for (int heads : {1, 64}) {
      for (bool composed : {false, true}) {
        for (int rows : {1, 7, 64, 256}) {
          IndexerQueryCase c(style, rows, heads, composed);
          EXPECT_TRUE(check_parity(c, cpu(), cuda(), 55 + rows));
        }
        EXPECT_TRUE(check_batch_invariance(
            [&](int rows) {
              return std::make_unique<IndexerQueryCase>(style, rows, heads, composed);
            },
            {1, 7, 64, 256}, cpu(), cuda()));
        // A row stride past the packed heads (the model's q_b | wq_b output: 24576 floats of q
        // first, so the index query's rows are 32768 apart; here 200 more, 16-byte aligned, and
        // 3 more, not).
        for (int pad : {200, 3}) {
          for (int rows : {1, 7, 64}) {
            IndexerQueryCase c(style, rows, heads, composed, pad);
            EXPECT_TRUE(check_parity(c, cpu(), cuda(), 77 + rows + pad));
          }
        }
      }
    }
  }
}

// With the fp8 encoding asked for (an fp8 index-K cache's step): the query and its encoding, bytes
// and scales, are the CPU's at every batch size and row stride, and a row's are the same alone or
// in a batch.
TEST_F(ParityFused, IndexerQueryFp8EncodingIsTheCpus) {
  for (RopeStyle style : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
    for (int heads : {1, 64}) {
      for (int pad : {0, 200, 3}) {
        for (int rows : {1, 7, 64, 256}) {
          IndexerQueryCase c(style, rows, heads, false, pad, true);
          EXPECT_TRUE(check_parity(c, cpu(), cuda(), 91 + rows + pad)) << c.vars();
        }
      }
      EXPECT_TRUE(check_batch_invariance(
          [&](int rows) {
            return std::make_unique<IndexerQueryCase>(style, rows, heads, false, 0, true);
          },
          {1, 7, 64, 256}, cpu(), cuda()));
    }
  }
}

}  // namespace
}  // namespace dsa::parity
