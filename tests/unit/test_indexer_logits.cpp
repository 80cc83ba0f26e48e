// The indexer's paged logits (DESIGN §1.5) against float64 references built from the same cache.
//
// bf16: one reference on the bf16-rounded q and the decoded keys; it bounds kernel error alone.
// fp8:  two references, in the manner of DeepGEMM's tests. The first uses the fp8-dequantized q
//       and k, so it separates kernel error (tight) from quantization error. The second uses the
//       unquantized q and k, and bounds the quantization error of the whole scheme (loose).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "common/test_util.h"
#include "dsa/error.h"
#include "dsa/token_codec.h"

namespace dsa {
namespace {

using testing::kPoison;
using testing::Rng;

constexpr int32_t kUnusedPage = 1 << 30;  // page-table entries past a row's tokens: never read

// A host index-K pool whose every slot outside page 0 holds a random key, and rows whose pages
// are drawn from a shuffled, non-contiguous list of page ids.
struct IndexerFixture {
  std::vector<uint8_t> bytes;
  PoolView pool;
  std::vector<float> keys;  // [capacity, 128] the keys before encoding (page 0: zero)
  std::vector<int32_t> seq_lens, page_table;
  std::vector<float> q, w;  // [rows, ld_q], [rows, ld_w]
  int rows = 0, heads = 0;
  int64_t ld_q = 0, ld_w = 0, ld_page_table = 0, ld_logits = 0;

  IndexerFixture(KvDtype dtype, ScaleRounding rounding, int n_heads,
                 const std::vector<int32_t>& lens, uint64_t seed)
      : seq_lens(lens), rows(int(lens.size())), heads(n_heads) {
    Rng rng(seed);
    const int32_t max_len = *std::max_element(lens.begin(), lens.end());
    ld_page_table = (max_len + kPageSize - 1) / kPageSize + 2;  // slack the op must not read
    ld_logits = max_len + 7;
    int64_t pages_needed = 1;
    for (int32_t len : lens) pages_needed += (len + kPageSize - 1) / kPageSize;
    pool.dtype = dtype;
    pool.rounding = rounding;
    pool.num_pages = pages_needed + 5;  // a few pages that no row owns
    bytes.assign(size_t(pool.num_pages * index_k_page_bytes(dtype)), 0);
    pool.data = bytes.data();
    keys.assign(size_t(pool.capacity()) * kIndexHeadDim, 0.0f);
    for (int64_t slot = kPageSize; slot < pool.capacity(); ++slot) {
      float* k = keys.data() + slot * kIndexHeadDim;
      for (int d = 0; d < kIndexHeadDim; ++d) k[d] = rng.normal();
      encode_index_k_token(pool, slot, k);
    }
    assign_pages(rng);
    ld_q = int64_t(heads) * kIndexHeadDim + 5;
    ld_w = heads + 3;
    q = rng.normals(size_t(rows * ld_q));
    w = rng.normals(size_t(rows * ld_w), 0.2f);
  }

  void assign_pages(Rng& rng) {
    std::vector<int32_t> free_pages(size_t(pool.num_pages - 1));
    std::iota(free_pages.begin(), free_pages.end(), 1);
    std::shuffle(free_pages.begin(), free_pages.end(), rng.gen());
    page_table.assign(size_t(rows * ld_page_table), kUnusedPage);
    size_t next = 0;
    for (int r = 0; r < rows; ++r) {
      int32_t* row = page_table.data() + r * ld_page_table;
      if (seq_lens[size_t(r)] == 0) std::fill(row, row + ld_page_table, kDummyPageRow);
      for (int i = 0; i * kPageSize < seq_lens[size_t(r)]; ++i) row[i] = free_pages[next++];
    }
  }

  int64_t slot(int r, int64_t t) const {
    return int64_t(page_table[size_t(r * ld_page_table + t / kPageSize)]) * kPageSize +
           t % kPageSize;
  }

  IndexerLogitsParams params(float* logits) const {
    IndexerLogitsParams p;
    p.q = q.data();
    p.w = w.data();
    p.page_table = page_table.data();
    p.seq_lens = seq_lens.data();
    p.logits = logits;
    p.pool = pool;
    p.rows = rows;
    p.heads = heads;
    p.ld_q = ld_q;
    p.ld_w = ld_w;
    p.ld_page_table = ld_page_table;
    p.ld_logits = ld_logits;
    return p;
  }

  std::vector<float> run() const {
    std::vector<float> logits(size_t(rows * ld_logits), kPoison);
    cpu::indexer_logits(params(logits.data()));
    return logits;
  }
};

enum class Reference { kDequantized, kUnquantized };

// sum_h w * relu(q_h . k_t) in float64. kDequantized uses exactly the values the op sees: for
// bf16, bf16(q) and the bf16 keys; for fp8, q8 * s_q and k8 * k_scale. kUnquantized uses the
// inputs before any rounding.
std::vector<double> reference_row(const IndexerFixture& f, int r, Reference ref) {
  const float* q = f.q.data() + r * f.ld_q;
  const float* w = f.w.data() + r * f.ld_w;
  std::vector<double> qd(size_t(f.heads) * kIndexHeadDim);
  std::vector<Fp8E4M3> q8(kIndexHeadDim);
  for (int h = 0; h < f.heads; ++h) {
    const float* qh = q + h * kIndexHeadDim;
    double* out = qd.data() + h * kIndexHeadDim;
    const bool fp8 = f.pool.dtype == KvDtype::kFp8;
    const float s_q =
        fp8 ? encode_fp8_group(qh, kIndexHeadDim, q8.data(), ScaleRounding::kExact) : 1.0f;
    for (int d = 0; d < kIndexHeadDim; ++d) {
      if (ref == Reference::kUnquantized)
        out[d] = qh[d];
      else if (fp8)
        out[d] = double(fp8_to_float(q8[size_t(d)])) * s_q;
      else
        out[d] = round_bf16(qh[d]);
    }
  }
  std::vector<double> logits(size_t(f.seq_lens[size_t(r)]));
  std::vector<float> key(kIndexHeadDim);
  for (int64_t t = 0; t < f.seq_lens[size_t(r)]; ++t) {
    const int64_t slot = f.slot(r, t);
    const float k_scale = decode_index_k_token(f.pool, slot, key.data());
    const float* raw = f.keys.data() + slot * kIndexHeadDim;
    double logit = 0;
    for (int h = 0; h < f.heads; ++h) {
      double dot = 0;
      for (int d = 0; d < kIndexHeadDim; ++d) {
        const double k =
            ref == Reference::kUnquantized ? double(raw[d]) : double(key[size_t(d)]) * k_scale;
        dot += qd[size_t(h * kIndexHeadDim + d)] * k;
      }
      logit += double(w[h]) * std::max(dot, 0.0);
    }
    logits[size_t(t)] = logit;
  }
  return logits;
}

std::vector<double> kernel_row(const IndexerFixture& f, const std::vector<float>& logits, int r) {
  const float* row = logits.data() + r * f.ld_logits;
  return std::vector<double>(row, row + f.seq_lens[size_t(r)]);
}

// Every element at t >= seq_len (the whole row for a padded row) still holds the poison bits.
void expect_untouched_tail(const IndexerFixture& f, const std::vector<float>& logits) {
  for (int r = 0; r < f.rows; ++r) {
    for (int64_t t = f.seq_lens[size_t(r)]; t < f.ld_logits; ++t) {
      const float v = logits[size_t(r * f.ld_logits + t)];
      ASSERT_TRUE(std::isnan(v)) << "row " << r << " t " << t << " was written: " << v;
    }
  }
}

const std::vector<int32_t> kLens = {1, 63, 64, 0, 65, 2100, 130, 0};

TEST(IndexerLogits, Bf16MatchesFloat64Reference) {
  const IndexerFixture f(KvDtype::kBf16, ScaleRounding::kExact, 16, kLens, 101);
  const std::vector<float> logits = f.run();
  for (int r = 0; r < f.rows; ++r) {
    if (f.seq_lens[size_t(r)] == 0) continue;
    const double err =
        testing::rel_error(kernel_row(f, logits, r), reference_row(f, r, Reference::kDequantized));
    EXPECT_LE(err, 1e-5) << "row " << r << " seq_len " << f.seq_lens[size_t(r)];
  }
  expect_untouched_tail(f, logits);
}

TEST(IndexerLogits, Bf16SixtyFourHeads) {
  const IndexerFixture f(KvDtype::kBf16, ScaleRounding::kExact, 64, {200, 0, 64}, 102);
  const std::vector<float> logits = f.run();
  for (int r : {0, 2}) {
    EXPECT_LE(
        testing::rel_error(kernel_row(f, logits, r), reference_row(f, r, Reference::kDequantized)),
        1e-5);
  }
  expect_untouched_tail(f, logits);
}

// fp8 e4m3 keeps 3 mantissa bits: a rounded value is off by about 2.5% rms, q and k both are, and
// the dots do not average it away in relative terms. With the cancellations of the signed head
// weights, the logits of these random inputs land 3-5.2% off; 10% bounds that
// with margin and still catches a wrong or missing scale.
constexpr double kFp8QuantizationBound = 0.10;

void check_fp8(ScaleRounding rounding, uint64_t seed) {
  const IndexerFixture f(KvDtype::kFp8, rounding, 16, kLens, seed);
  const std::vector<float> logits = f.run();
  for (int r = 0; r < f.rows; ++r) {
    if (f.seq_lens[size_t(r)] == 0) continue;
    const std::vector<double> got = kernel_row(f, logits, r);
    EXPECT_LE(testing::rel_error(got, reference_row(f, r, Reference::kDequantized)), 1e-5)
        << "kernel error, row " << r << " seq_len " << f.seq_lens[size_t(r)];
    if (f.seq_lens[size_t(r)] < 32) continue;  // too few tokens for a statistical bound
    EXPECT_LE(testing::rel_error(got, reference_row(f, r, Reference::kUnquantized)),
              kFp8QuantizationBound)
        << "quantization error, row " << r;
  }
  expect_untouched_tail(f, logits);
}

TEST(IndexerLogits, Fp8MatchesDequantizedAndUnquantizedReferences) {
  check_fp8(ScaleRounding::kExact, 103);
}

TEST(IndexerLogits, Fp8Ue8m0PoolScales) { check_fp8(ScaleRounding::kUe8m0, 104); }

TEST(IndexerLogits, Fp8QuantizationIsNotFree) {
  // The unquantized reference is a real second opinion: fp8 moves the logits measurably.
  const IndexerFixture f(KvDtype::kFp8, ScaleRounding::kExact, 16, {500}, 105);
  const std::vector<float> logits = f.run();
  EXPECT_GE(
      testing::rel_error(kernel_row(f, logits, 0), reference_row(f, 0, Reference::kUnquantized)),
      1e-3);
}

TEST(IndexerLogits, PaddedRowsWriteNothing) {
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    const IndexerFixture f(dtype, ScaleRounding::kExact, 8, {0, 0, 0}, 106);
    const std::vector<float> logits = f.run();
    expect_untouched_tail(f, logits);
  }
}

// Each row of a batch equals, bit for bit, that row run alone.
TEST(IndexerLogits, BatchInvariant) {
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    const IndexerFixture f(dtype, ScaleRounding::kExact, 8, {65, 0, 1, 300, 64}, 107);
    const std::vector<float> batch = f.run();
    for (int r = 0; r < f.rows; ++r) {
      std::vector<float> alone(size_t(f.ld_logits), kPoison);
      IndexerLogitsParams p = f.params(alone.data());
      p.rows = 1;
      p.q += r * f.ld_q;
      p.w += r * f.ld_w;
      p.page_table += r * f.ld_page_table;
      p.seq_lens += r;
      cpu::indexer_logits(p);
      EXPECT_EQ(
          std::memcmp(alone.data(), batch.data() + r * f.ld_logits, alone.size() * sizeof(float)),
          0)
          << kv_dtype_name(dtype) << " row " << r;
    }
  }
}

// w_scale multiplies each stored weight once, in f32: the logits of (w, w_scale) are bit for bit
// those of the weights w_scale * w stored with w_scale = 1 (what a GEMM with alpha = w_scale
// would have written), and differ from those of w alone.
TEST(IndexerLogits, WeightScaleIsOneMultiplyOfTheStoredWeights) {
  const float w_scale = 1.0f / std::sqrt(64.0f * 128.0f);
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    IndexerFixture f(dtype, ScaleRounding::kExact, 8, {65, 0, 300, 1}, 110);
    const std::vector<float> unscaled = f.run();
    std::vector<float> scaled(size_t(f.rows * f.ld_logits), kPoison);
    IndexerLogitsParams p = f.params(scaled.data());
    p.w_scale = w_scale;
    cpu::indexer_logits(p);
    for (float& w : f.w) w = w_scale * w;
    const std::vector<float> prescaled = f.run();
    EXPECT_EQ(std::memcmp(scaled.data(), prescaled.data(), scaled.size() * sizeof(float)), 0)
        << kv_dtype_name(dtype);
    int moved = 0;
    for (size_t i = 0; i < scaled.size(); ++i) moved += scaled[i] != unscaled[i];
    EXPECT_GT(moved, 300) << kv_dtype_name(dtype);  // 366 written logits, nearly all nonzero
    expect_untouched_tail(f, scaled);
  }
}

// A page id outside the pool is never read: its tokens' logits are 0 and the row raises the
// step's error flag once per bad page (the CUDA kernel does the same, tests/parity).
TEST(IndexerLogits, PageOutsideThePoolRaisesTheErrorFlagAndIsNeverRead) {
  for (int32_t bad : {-7, 1 << 20}) {
    IndexerFixture f(KvDtype::kBf16, ScaleRounding::kExact, 4, {70, 140}, 108);
    const std::vector<float> good = f.run();
    f.page_table[1] = f.pool.num_pages;           // row 0's second page: tokens 64..69
    f.page_table[size_t(f.ld_page_table)] = bad;  // row 1's first page: tokens 0..63
    std::vector<float> logits(size_t(f.rows * f.ld_logits), kPoison);
    int32_t errors = 0;
    IndexerLogitsParams p = f.params(logits.data());
    p.error_count = &errors;
    cpu::indexer_logits(p);
    EXPECT_EQ(errors, 2);
    for (int64_t t = 0; t < 140; ++t) {
      const size_t i1 = size_t(f.ld_logits + t);
      if (t < 70) {
        const float want = t < 64 ? good[size_t(t)] : 0.0f;
        EXPECT_EQ(logits[size_t(t)], want) << "row 0 token " << t;
      }
      EXPECT_EQ(logits[i1], t < 64 ? 0.0f : good[i1]) << "row 1 token " << t;
    }
  }
}

}  // namespace
}  // namespace dsa
