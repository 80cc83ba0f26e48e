// Top-k over the indexer's logits (DESIGN §1.6) against a naive full sort with the same rules:
// ties to the lower position, seq_len <= k takes everything, -1 fill, ascending output, NaN the
// smallest of all values, and positions >= seq_len never chosen whatever they hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "common/test_util.h"
#include "dsa/error.h"

namespace dsa {
namespace {

using testing::Rng;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int32_t kPoisonPosition = 0x5A5A5A5A;
constexpr int64_t kPoisonSlot = 0x5A5A5A5A5A5A5A5A;

struct TopkFixture {
  std::vector<float> logits;  // [rows, ld_logits]; entries >= seq_len are +inf bait
  std::vector<int32_t> seq_lens, page_table;
  int rows = 0, k = 0;
  int64_t ld_logits = 0, ld_page_table = 0;

  TopkFixture(const std::vector<int32_t>& lens, int top, Rng& rng)
      : seq_lens(lens), rows(int(lens.size())), k(top) {
    const int32_t max_len = std::max(1, *std::max_element(lens.begin(), lens.end()));
    ld_logits = max_len + 3;
    logits.assign(size_t(rows * ld_logits), kInf);  // would win if the length did not mask
    for (int r = 0; r < rows; ++r) {
      for (int32_t t = 0; t < lens[size_t(r)]; ++t)
        logits[size_t(r * ld_logits + t)] = rng.normal();
    }
    // Distinct, shuffled page ids per row: the slot mapping cannot be guessed from the position.
    ld_page_table = (max_len + kPageSize - 1) / kPageSize + 1;
    page_table.resize(size_t(rows * ld_page_table));
    std::iota(page_table.begin(), page_table.end(), 1);
    std::shuffle(page_table.begin(), page_table.end(), rng.gen());
  }

  TopkParams params(int32_t* positions, int64_t* slots) const {
    TopkParams p;
    p.logits = logits.data();
    p.seq_lens = seq_lens.data();
    p.out_positions = positions;
    p.out_slots = slots;
    p.page_table = page_table.data();
    p.rows = rows;
    p.k = k;
    p.ld_logits = ld_logits;
    p.ld_page_table = ld_page_table;
    return p;
  }

  struct Result {
    std::vector<int32_t> positions;
    std::vector<int64_t> slots;
  };
  Result run() const {
    Result out{std::vector<int32_t>(size_t(rows * k), kPoisonPosition),
               std::vector<int64_t>(size_t(rows * k), kPoisonSlot)};
    cpu::topk(params(out.positions.data(), out.slots.data()));
    return out;
  }
};

// The naive rule: stable-sort every position by (is a number, value) descending, so equal keys
// keep ascending positions; take the first min(k, seq_len); sort them; pad with -1.
std::vector<int32_t> naive_topk(const float* logits, int32_t seq_len, int k) {
  std::vector<int32_t> order(size_t(std::max(seq_len, 0)));
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t t) {
    const float v = logits[t];
    return std::pair<int, double>(std::isnan(v) ? 0 : 1, std::isnan(v) ? 0.0 : double(v));
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key(a) > key(b); });
  order.resize(std::min(order.size(), size_t(k)));
  std::sort(order.begin(), order.end());
  order.resize(size_t(k), -1);
  return order;
}

void expect_matches_naive(const TopkFixture& f, const TopkFixture::Result& got) {
  for (int r = 0; r < f.rows; ++r) {
    const std::vector<int32_t> want =
        naive_topk(f.logits.data() + r * f.ld_logits, f.seq_lens[size_t(r)], f.k);
    const std::vector<int32_t> row(got.positions.begin() + r * f.k,
                                   got.positions.begin() + (r + 1) * f.k);
    ASSERT_EQ(row, want) << "row " << r << " seq_len " << f.seq_lens[size_t(r)];
    for (int i = 0; i < f.k; ++i) {
      const int32_t t = row[size_t(i)];
      const int64_t want_slot =
          t < 0 ? kPadSlot
                : int64_t(f.page_table[size_t(r * f.ld_page_table + t / kPageSize)]) * kPageSize +
                      t % kPageSize;
      ASSERT_EQ(got.slots[size_t(r * f.k + i)], want_slot) << "row " << r << " entry " << i;
    }
  }
}

TEST(Topk, MatchesNaiveSortOverManyLengths) {
  Rng rng(201);
  const TopkFixture f({1, 63, 64, 65, 0, 16, 17, 500, 2047}, 16, rng);
  expect_matches_naive(f, f.run());
}

TEST(Topk, ShortRowsTakeEverythingInOrder) {
  Rng rng(202);
  const TopkFixture f({5, 32, 1}, 32, rng);
  const TopkFixture::Result got = f.run();
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(got.positions[size_t(i)], i < 5 ? i : -1);
    EXPECT_EQ(got.positions[size_t(32 + i)], i);
    EXPECT_EQ(got.positions[size_t(64 + i)], i < 1 ? i : -1);
  }
  expect_matches_naive(f, got);
}

TEST(Topk, PaddedRowIsAllMinusOne) {
  Rng rng(203);
  const TopkFixture f({0, 100, 0}, 8, rng);
  const TopkFixture::Result got = f.run();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(got.positions[size_t(i)], -1);
    EXPECT_EQ(got.slots[size_t(i)], kPadSlot);
    EXPECT_EQ(got.positions[size_t(16 + i)], -1);
    EXPECT_EQ(got.slots[size_t(16 + i)], kPadSlot);
  }
  expect_matches_naive(f, got);
}

TEST(Topk, TiesGoToTheLowerPosition) {
  Rng rng(204);
  TopkFixture f({1000, 300, 64}, 100, rng);
  // Three levels only, so every cut splits a large group of equal logits.
  for (int r = 0; r < f.rows; ++r) {
    for (int32_t t = 0; t < f.seq_lens[size_t(r)]; ++t) {
      f.logits[size_t(r * f.ld_logits + t)] = float(rng.integer(0, 2));
    }
  }
  // Row 2: all equal, so exactly the first k positions win.
  for (int32_t t = 0; t < 64; ++t) f.logits[size_t(2 * f.ld_logits + t)] = 0.5f;
  f.k = 40;
  const TopkFixture::Result got = f.run();
  expect_matches_naive(f, got);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(got.positions[size_t(2 * 40 + i)], i);
}

TEST(Topk, SignedZerosAreEqual) {
  Rng rng(205);
  TopkFixture f({6}, 2, rng);
  const float values[] = {-1.0f, 0.0f, -2.0f, -0.0f, -3.0f, 0.0f};
  std::copy(std::begin(values), std::end(values), f.logits.begin());
  const TopkFixture::Result got = f.run();
  EXPECT_EQ(got.positions, (std::vector<int32_t>{1, 3}));
}

TEST(Topk, NanRanksBelowEverything) {
  Rng rng(206);
  TopkFixture f({10, 10, 10}, 6, rng);
  float* row0 = f.logits.data();
  float* row1 = row0 + f.ld_logits;
  float* row2 = row1 + f.ld_logits;
  // Row 0: four numbers (one -inf) among NaNs; the numbers win, then the lowest NaN positions.
  const float mixed[] = {kNan, 3.0f, kNan, -kInf, kNan, kNan, 1.0f, kNan, -5.0f, kNan};
  std::copy(std::begin(mixed), std::end(mixed), row0);
  // Row 1: all NaN: the first k positions, as for any tie.
  std::fill(row1, row1 + 10, kNan);
  // Row 2: NaNs among plenty of numbers: never chosen.
  for (int t = 0; t < 10; ++t) row2[t] = t % 3 == 0 ? kNan : float(t);
  const TopkFixture::Result got = f.run();
  expect_matches_naive(f, got);
  EXPECT_EQ(std::vector<int32_t>(got.positions.begin(), got.positions.begin() + 6),
            (std::vector<int32_t>{0, 1, 2, 3, 6, 8}));
  EXPECT_EQ(std::vector<int32_t>(got.positions.begin() + 6, got.positions.begin() + 12),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(got.positions.begin() + 12, got.positions.end()),
            (std::vector<int32_t>{1, 2, 4, 5, 7, 8}));
}

TEST(Topk, LongContextFullIndexTopk) {
  Rng rng(207);
  TopkFixture f({131072, 0, 2048, 4000}, 2048, rng);
  for (int32_t t = 0; t < 131072; t += 7) f.logits[size_t(t)] = 1.25f;  // a huge tie group
  expect_matches_naive(f, f.run());
}

TEST(Topk, PositionsOnlyWithoutSlots) {
  Rng rng(208);
  const TopkFixture f({300, 7}, 8, rng);
  std::vector<int32_t> positions(16, kPoisonPosition);
  TopkParams p = f.params(positions.data(), nullptr);
  p.page_table = nullptr;
  cpu::topk(p);
  EXPECT_EQ(positions, f.run().positions);
}

TEST(Topk, SlotsWithoutPageTableIsAnError) {
  Rng rng(209);
  const TopkFixture f({30}, 8, rng);
  std::vector<int32_t> positions(8);
  std::vector<int64_t> slots(8);
  TopkParams p = f.params(positions.data(), slots.data());
  p.page_table = nullptr;
  EXPECT_THROW(cpu::topk(p), Error);
}

// Each row of a batch equals, bit for bit, that row run alone.
TEST(Topk, BatchInvariant) {
  Rng rng(210);
  const TopkFixture f({700, 0, 3, 64, 65, 129}, 64, rng);
  const TopkFixture::Result batch = f.run();
  for (int r = 0; r < f.rows; ++r) {
    std::vector<int32_t> positions(size_t(f.k), kPoisonPosition);
    std::vector<int64_t> slots(size_t(f.k), kPoisonSlot);
    TopkParams p = f.params(positions.data(), slots.data());
    p.rows = 1;
    p.logits += r * f.ld_logits;
    p.seq_lens += r;
    p.page_table += r * f.ld_page_table;
    cpu::topk(p);
    EXPECT_EQ(std::memcmp(positions.data(), batch.positions.data() + r * f.k, f.k * 4), 0);
    EXPECT_EQ(std::memcmp(slots.data(), batch.slots.data() + r * f.k, f.k * 8), 0);
  }
}

}  // namespace
}  // namespace dsa
