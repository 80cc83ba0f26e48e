// Parity of the DSA decode hot path (DESIGN §1.5-7): indexer logits, top-k and sparse MLA on
// CUDA against the CPU reference, plus batch invariance at 1, 7, 64 and 256 rows.
//
// Inputs cover: random non-contiguous page tables, padded rows (seq_len 0, all -1 indices),
// sentinel / out-of-range / negative indices, strides that are not a multiple of 4 floats, and
// logits past seq_len set to huge values (top-k must mask by length, never read them).
// Outputs start as NaN poison inside guard bytes: a logit at t >= seq_len must stay poison.
//
// Tolerances (nmse = sum (cpu - cuda)^2 / sum cpu^2):
//   indexer logits, bf16 cache: 1e-8. Identical bf16 inputs, only the f32 summation order differs.
//   indexer logits, fp8 cache: 1e-8. Identical e4m3 operands, widened exactly to f16 for the
//       f16 mma (mma.sync or wgmma; never the e4m3 wgmma, whose accumulation is narrower than
//       f32), so the products are exact and only the f32 summation order differs, as for bf16.
//   sparse MLA, bf16 cache: out 2e-5, lse 1e-8. CUDA rounds P to bf16 for the tensor cores (a
//       relative error near 2^-9 per weight); the scores are exact products summed in f32.
//   sparse MLA, fp8 cache: out 2e-4, lse 5e-6. CUDA also rounds the dequantized c (e4m3 * tile
//       scale) to bf16 in shared memory, so each score carries a relative error near 2^-9 of
//       its own size, while the CPU dequantizes in f32. A float64 model of exactly these
//       roundings measures out ~2e-5 and lse ~4e-7 on these inputs (bf16: 3e-7 and 2e-14).
//   A wrong token, head or mask gives nmse near 1 in every case.
//   top-k positions and slots: exact, bytes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsa/slot.h"
#include "dsa/token_codec.h"
#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

constexpr double kLogitsBf16Nmse = 1e-8;
constexpr double kLogitsFp8Nmse = 1e-8;
// "wgmma-e4m3" sums the products on the fp8 tensor core, whose accumulator keeps 13 mantissa
// bits (the products of an instruction aligned to their largest and truncated). A model of that
// accumulator over this file's data gives an nmse of 1.7e-7 (2.4e-7 at most over 20 rows); the
// e4m3 layout's own rounding of the keys is about 1e-3.
constexpr double kLogitsE4m3Nmse = 1e-6;

// The fp8 logits' bound for the variant this process runs: DSA_CUDA_INDEXER_VARIANT, else the
// fp8 default, "wgmma-e4m3" (indexer_logits.cu).
double fp8_logits_nmse() {
  const char* v = std::getenv("DSA_CUDA_INDEXER_VARIANT");
  return !v || std::string(v) == "wgmma-e4m3" ? kLogitsE4m3Nmse : kLogitsFp8Nmse;
}
constexpr double kAttentionOutNmse[] = {2e-5, 2e-4};  // by KvDtype: bf16, fp8
constexpr double kAttentionLseNmse[] = {1e-8, 5e-6};
constexpr float kJunk = 9.5e8f;  // fills stride padding; a kernel that reads it goes far off

// A random page-table row of `n` entries: distinct-enough page ids in [1, pages), any order.
std::vector<int32_t> random_pages(testing::Rng& rng, int64_t n, int64_t pages) {
  std::vector<int32_t> row(static_cast<size_t>(n));
  for (auto& p : row) p = int32_t(rng.integer(1, pages - 1));
  return row;
}

// ---- indexer logits ----------------------------------------------------------------------------

struct IndexerSpec {
  KvDtype dtype;
  ScaleRounding rounding;
  int rows, heads, max_len;
  bool padded_stride;
  bool bad_pages = false;  // some rows' tables hold page ids outside the pool
  float w_scale = 1.0f;    // IndexerLogitsParams::w_scale
  // fp8: q's encoding handed to the op too (IndexerLogitsParams::q_fp8, as indexer_query writes
  // it: the group encoder per head), at a row stride 16 bytes past the packed heads.
  bool given_query = false;
};

class IndexerCase final : public OpCase {
 public:
  explicit IndexerCase(IndexerSpec s) : s_(s) {}
  std::string name() const override { return "indexer_logits"; }
  std::string vars() const override {
    std::string v = std::string("dtype=") + kv_dtype_name(s_.dtype);
    if (s_.dtype == KvDtype::kFp8) v += s_.rounding == ScaleRounding::kUe8m0 ? "/ue8m0" : "/exact";
    return v + ",rows=" + std::to_string(s_.rows) + ",heads=" + std::to_string(s_.heads) +
           ",max_len=" + std::to_string(s_.max_len) + (s_.padded_stride ? ",padded_stride" : "") +
           (s_.given_query ? ",given_query" : "");
  }

  void init(Workspace& ws, testing::Rng& rng) override {
    // The pool: every page but the reserved one holds encoded random keys.
    std::vector<uint8_t> pool(size_t(kPages * index_k_page_bytes(s_.dtype)), 0);
    const PoolView host{pool.data(), s_.dtype, s_.rounding, kPages};
    for (int64_t slot = kPageSize; slot < host.capacity(); ++slot) {
      const float mag = std::exp(rng.uniform(-2.0f, 2.0f));
      const std::vector<float> k = rng.normals(kIndexHeadDim, mag);
      encode_index_k_token(host, slot, k.data());
    }
    pool_ = ws.input(pool);

    ld_pt_ = (s_.max_len + kPageSize - 1) / kPageSize + 1;
    ld_q_ = int64_t(s_.heads) * kIndexHeadDim + (s_.padded_stride ? 3 : 0);
    ld_w_ = s_.heads + (s_.padded_stride ? 1 : 0);
    ld_logits_ = s_.max_len + 7;
    std::vector<int32_t> seq_lens, table;
    std::vector<float> q, w;
    for (int r = 0; r < s_.rows; ++r) {  // per-row data in row order (batch invariance)
      int32_t len = r == 0 ? s_.max_len : int32_t(rng.integer(1, s_.max_len));
      if (r % 5 == 1) len = 0;  // a padded row
      seq_lens.push_back(len);
      auto pages = random_pages(rng, ld_pt_, kPages);
      if (s_.bad_pages && r % 3 == 2) {  // never read: logits 0 and one error per bad page
        pages[0] = r % 2 ? -3 : int32_t(kPages);
        if (ld_pt_ > 2) pages[size_t(ld_pt_ - 2)] = int32_t(kPages) + 1000;
      }
      table.insert(table.end(), pages.begin(), pages.end());
      for (int h = 0; h < s_.heads; ++h) {
        const float mag = std::exp(rng.uniform(-3.0f, 2.0f));  // per-head fp8 scales differ
        for (int d = 0; d < kIndexHeadDim; ++d) q.push_back(rng.normal(mag));
      }
      q.resize(size_t(r + 1) * ld_q_, kJunk);
      for (int h = 0; h < s_.heads; ++h) w.push_back(rng.normal(0.2f));
      w.resize(size_t(r + 1) * ld_w_, kJunk);
    }
    seq_lens_ = ws.input(seq_lens);
    table_ = ws.input(table);
    q_ = ws.input(q);
    w_ = ws.input(w);
    if (s_.given_query) {
      ld_q8_ = int64_t(s_.heads) * kIndexHeadDim + 16;
      std::vector<uint8_t> q8(size_t(s_.rows) * ld_q8_, 0x5A);
      std::vector<float> scales(size_t(s_.rows) * s_.heads);
      for (int r = 0; r < s_.rows; ++r) {
        for (int h = 0; h < s_.heads; ++h) {
          auto* out = reinterpret_cast<Fp8E4M3*>(q8.data() + r * ld_q8_ + h * kIndexHeadDim);
          scales[size_t(r) * s_.heads + h] = encode_fp8_group(
              q.data() + r * ld_q_ + h * kIndexHeadDim, kIndexHeadDim, out, ScaleRounding::kExact);
        }
      }
      q8_ = ws.input(q8);
      q_scale_ = ws.input(scales);
    }
    const double tol = s_.dtype == KvDtype::kBf16 ? kLogitsBf16Nmse : fp8_logits_nmse();
    logits_ = ws.output<float>(size_t(s_.rows) * ld_logits_, Check::nmse(tol).per_row(ld_logits_));
    errors_ = ws.inout(std::vector<int32_t>{0}, Check::exact());
  }

  void run(Workspace& ws, Side side) override {
    IndexerLogitsParams p;
    p.q = ws.ptr(q_, side);
    p.w = ws.ptr(w_, side);
    p.page_table = ws.ptr(table_, side);
    p.seq_lens = ws.ptr(seq_lens_, side);
    p.logits = ws.ptr(logits_, side);
    p.pool = PoolView{ws.ptr(pool_, side), s_.dtype, s_.rounding, kPages};
    p.rows = s_.rows;
    p.heads = s_.heads;
    p.ld_q = ld_q_, p.ld_w = ld_w_, p.ld_page_table = ld_pt_, p.ld_logits = ld_logits_;
    p.error_count = ws.ptr(errors_, side);
    p.w_scale = s_.w_scale;
    if (s_.given_query) {
      p.q_fp8 = ws.ptr(q8_, side);
      p.q_fp8_scale = ws.ptr(q_scale_, side);
      p.ld_q_fp8 = ld_q8_;
    }
    ws.backend(side).indexer_logits(p);
  }

 private:
  static constexpr int64_t kPages = 48;
  IndexerSpec s_;
  Buf<uint8_t> pool_, q8_;
  Buf<int32_t> seq_lens_, table_;
  Buf<float> q_, w_, logits_, q_scale_;
  Buf<int32_t> errors_;
  int64_t ld_pt_ = 0, ld_q_ = 0, ld_w_ = 0, ld_logits_ = 0, ld_q8_ = 0;
};

// ---- top-k -------------------------------------------------------------------------------------

// kFewLevels: three values, so a long row's threshold bin holds far more keys than CUDA gathers
// into shared memory (it takes the passes from global memory instead).
enum class Values { kNormal, kTies, kSpecials, kFewLevels };

struct TopkSpec {
  int rows, k, len;
  Values values;
  bool with_slots;
  bool odd_stride;  // ld_logits = len + 1: rows not 16-byte aligned
};

float draw_logit(testing::Rng& rng, Values v) {
  if (v == Values::kNormal) return rng.normal(3.0f);
  if (v == Values::kFewLevels) return float(rng.integer(-1, 1));
  const float tie = float(rng.integer(-6, 6)) * 0.25f;  // 13 levels: ties everywhere
  if (v == Values::kTies) return tie;
  switch (rng.integer(0, 49)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return -std::numeric_limits<float>::quiet_NaN();
    case 2:
      return -0.0f;
    case 3:
      return 0.0f;
    case 4:
      return std::numeric_limits<float>::infinity();
    case 5:
      return -std::numeric_limits<float>::infinity();
    default:
      return tie;
  }
}

class TopkCase final : public OpCase {
 public:
  explicit TopkCase(TopkSpec s) : s_(s) {}
  std::string name() const override { return "topk"; }
  std::string vars() const override {
    static const char* kValueNames[] = {"normal", "ties", "specials", "few_levels"};
    return "rows=" + std::to_string(s_.rows) + ",k=" + std::to_string(s_.k) +
           ",len=" + std::to_string(s_.len) + ",values=" + kValueNames[int(s_.values)] +
           (s_.with_slots ? ",slots" : "") + (s_.odd_stride ? ",odd_stride" : "");
  }

  void init(Workspace& ws, testing::Rng& rng) override {
    ld_logits_ = s_.len + (s_.odd_stride ? 1 : 0);
    ld_pt_ = (s_.len + kPageSize - 1) / kPageSize;
    std::vector<int32_t> seq_lens, table;
    std::vector<float> logits;
    for (int r = 0; r < s_.rows; ++r) {
      const int k = s_.k, len = s_.len;
      int32_t n = len;
      switch (r % 6) {
        case 1:
          n = 0;
          break;  // padded row
        case 2:
          n = std::min(k, len);
          break;  // exactly k
        case 3:
          n = std::min(k + 1, len);
          break;  // one to drop
        case 4:
          n = int32_t(rng.integer(1, std::min(k, len)));
          break;  // fewer than k
        case 5:
          n = int32_t(rng.integer(std::min(k, len), len));
          break;
        default:
          break;
      }
      seq_lens.push_back(n);
      for (int64_t t = 0; t < ld_logits_; ++t) {
        // Past seq_len: huge values, which a kernel that reads them would pick.
        logits.push_back(t < n ? draw_logit(rng, s_.values) : 3e38f);
      }
      const auto pages = random_pages(rng, ld_pt_, 1 << 20);
      table.insert(table.end(), pages.begin(), pages.end());
    }
    seq_lens_ = ws.input(seq_lens);
    logits_ = ws.input(logits);
    table_ = ws.input(table);
    positions_ = ws.output<int32_t>(size_t(s_.rows) * s_.k, Check::exact());
    if (s_.with_slots) slots_ = ws.output<int64_t>(size_t(s_.rows) * s_.k, Check::exact());
  }

  void run(Workspace& ws, Side side) override {
    TopkParams p;
    p.logits = ws.ptr(logits_, side);
    p.seq_lens = ws.ptr(seq_lens_, side);
    p.out_positions = ws.ptr(positions_, side);
    p.out_slots = s_.with_slots ? ws.ptr(slots_, side) : nullptr;
    p.page_table = ws.ptr(table_, side);
    p.rows = s_.rows, p.k = s_.k;
    p.ld_logits = ld_logits_, p.ld_page_table = ld_pt_;
    ws.backend(side).topk(p);
  }

 private:
  TopkSpec s_;
  Buf<int32_t> seq_lens_, table_, positions_;
  Buf<float> logits_;
  Buf<int64_t> slots_;
  int64_t ld_logits_ = 0, ld_pt_ = 0;
};

// ---- sparse MLA --------------------------------------------------------------------------------

struct MlaSpec {
  KvDtype dtype;
  int rows, heads, topk;
  bool padded_stride;
  // CUDA's heads per CTA (DSA_CUDA_SPARSE_MLA_HEADS while it runs; the mma.sync and ws kernels):
  // 16, 32 or 64; -1 "auto" (the batch's choice); 0 unset (the kernel's default). Every choice
  // must give the same bits.
  int heads_per_cta = 0;
  // The outputs get one more row than the batch, which must stay poison (nothing written past
  // the batch). Off in the batch-invariance families, whose rows are compared by prefix.
  bool spare_row = false;
  // CUDA's bound on splits per row (DSA_CUDA_SPARSE_MLA_MAX_SPLITS while it runs): 1, 2, 8 or 16,
  // or 0 for the default (4). It moves the split boundaries, so only runs with the same bound
  // compare.
  int max_splits = 0;
  // CUDA's kernel family (DSA_CUDA_SPARSE_MLA_VARIANT while it runs): "wgmma", "wgmma64" or
  // "mma"; null is "mma", whose heads per CTA the families above force. The families give different
  // bits: only runs of one family compare, whichever of them is the process default.
  const char* variant = nullptr;
  // bf16 only: every token holds the bf16 rounding of what the fp8 case of the same seed decodes
  // to (e4m3 * tile scale, the CUDA kernels' dequantized values), the rope as it is. The same
  // random draws as the fp8 case, so indices and q agree too: a kernel that expands fp8 into bf16
  // tiles must give, on the fp8 case, its own bits on this one.
  bool dequantized_pool = false;
};

// Sets an environment variable for a scope (unset again at its end); null value: leaves it unset.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value != nullptr) setenv(name, value, 1);
  }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

class SparseMlaCase final : public OpCase {
 public:
  explicit SparseMlaCase(MlaSpec s) : s_(s) {}
  std::string name() const override { return "sparse_mla"; }
  std::string vars() const override {
    return std::string("dtype=") + kv_dtype_name(s_.dtype) + ",rows=" + std::to_string(s_.rows) +
           ",heads=" + std::to_string(s_.heads) + ",topk=" + std::to_string(s_.topk) +
           (s_.padded_stride ? ",padded_stride" : "") +
           (s_.heads_per_cta ? ",heads_per_cta=" + std::to_string(s_.heads_per_cta) : "") +
           (s_.max_splits ? ",max_splits=" + std::to_string(s_.max_splits) : "") +
           (s_.spare_row ? ",spare_row" : "") +
           (s_.variant != nullptr ? std::string(",variant=") + s_.variant : "") +
           (s_.dequantized_pool ? ",dequantized_pool" : "");
  }

  void init(Workspace& ws, testing::Rng& rng) override {
    std::vector<uint8_t> pool(size_t(kPages * latent_page_bytes(s_.dtype)), 0);
    const PoolView host{pool.data(), s_.dtype, ScaleRounding::kExact, kPages};
    ASSERT_TRUE(!s_.dequantized_pool || s_.dtype == KvDtype::kBf16);
    std::vector<uint8_t> fp8_token(size_t(latent_token_bytes(KvDtype::kFp8)));
    const PoolView fp8_one{fp8_token.data(), KvDtype::kFp8, ScaleRounding::kExact, 1};
    for (int64_t slot = kPageSize; slot < host.capacity(); ++slot) {
      std::vector<float> c = rng.normals(kKvLoraRank, std::exp(rng.uniform(-1.0f, 1.0f)));
      std::vector<float> rope = rng.normals(kRopeDim);
      if (s_.dequantized_pool) {  // through the fp8 encoding and back, then bf16-exact values
        std::vector<float> back(kLatentDim);
        encode_latent_token(fp8_one, 0, c.data(), rope.data());
        decode_latent_token(fp8_one, 0, back.data());
        for (int i = 0; i < kKvLoraRank; ++i) c[size_t(i)] = round_bf16(back[size_t(i)]);
        for (int i = 0; i < kRopeDim; ++i) rope[size_t(i)] = back[size_t(kKvLoraRank + i)];
      }
      encode_latent_token(host, slot, c.data(), rope.data());
    }
    pool_ = ws.input(pool);

    const int64_t pad = s_.padded_stride ? 3 : 0;
    ld_q_ = int64_t(s_.heads) * kLatentDim + pad;
    ld_idx_ = s_.topk + pad;
    ld_out_ = int64_t(s_.heads) * kKvLoraRank + pad;
    const int64_t capacity = host.capacity();
    std::vector<int64_t> indices;
    std::vector<float> q;
    for (int r = 0; r < s_.rows; ++r) {
      for (int j = 0; j < s_.topk; ++j) {
        int64_t slot = rng.integer(0, capacity - 1);  // page 0 (zeros) may be selected too
        const int64_t u = rng.integer(0, 99);
        if (u < 6)
          slot = kPadSlot;
        else if (u < 8)
          slot = capacity + rng.integer(0, 100);
        else if (u < 9)
          slot = -rng.integer(2, 1000);
        if (r % 4 == 3) slot = kPadSlot;  // a padded row: nothing selected
        // A short context: only the first 40 entries are used, so the later token splits of
        // the CUDA kernel see nothing valid and must not move the result.
        if (r % 4 == 2 && j >= 40) slot = kPadSlot;
        indices.push_back(slot);
      }
      indices.resize(size_t(r + 1) * ld_idx_, int64_t(5));  // stride padding: never read
      // Scores with a spread of a few units: a peaked but not one-hot softmax.
      for (int i = 0; i < s_.heads * kLatentDim; ++i) q.push_back(rng.normal(1.0f));
      q.resize(size_t(r + 1) * ld_q_, kJunk);
    }
    indices_ = ws.input(indices);
    q_ = ws.input(q);
    const int d = s_.dtype == KvDtype::kBf16 ? 0 : 1;
    const size_t out_rows = size_t(s_.rows) + (s_.spare_row ? 1 : 0);
    out_ = ws.output<float>(out_rows * ld_out_, Check::nmse(kAttentionOutNmse[d]).per_row(ld_out_));
    lse_ =
        ws.output<float>(out_rows * s_.heads, Check::nmse(kAttentionLseNmse[d]).per_row(s_.heads));
  }

  void run(Workspace& ws, Side side) override {
    SparseMlaParams p;
    p.q = ws.ptr(q_, side);
    p.indices = ws.ptr(indices_, side);
    p.out = ws.ptr(out_, side);
    p.lse = ws.ptr(lse_, side);
    p.pool = PoolView{ws.ptr(pool_, side), s_.dtype, ScaleRounding::kExact, kPages};
    p.rows = s_.rows, p.heads = s_.heads, p.topk = s_.topk;
    p.ld_q = ld_q_, p.ld_indices = ld_idx_, p.ld_out = ld_out_;
    p.scale = 1.0f / std::sqrt(float(128 + kRopeDim));
    const std::string forced = std::to_string(s_.heads_per_cta);
    const std::string splits = std::to_string(s_.max_splits);
    ScopedEnv heads_env("DSA_CUDA_SPARSE_MLA_HEADS", s_.heads_per_cta > 0   ? forced.c_str()
                                                     : s_.heads_per_cta < 0 ? "auto"
                                                                            : nullptr);
    ScopedEnv splits_env("DSA_CUDA_SPARSE_MLA_MAX_SPLITS",
                         s_.max_splits ? splits.c_str() : nullptr);
    ScopedEnv variant_env("DSA_CUDA_SPARSE_MLA_VARIANT",
                          s_.variant != nullptr ? s_.variant : "mma");
    ws.backend(side).sparse_mla(p);
  }

 private:
  static constexpr int64_t kPages = 40;
  MlaSpec s_;
  Buf<uint8_t> pool_;
  Buf<int64_t> indices_;
  Buf<float> q_, out_, lse_;
  int64_t ld_q_ = 0, ld_idx_ = 0, ld_out_ = 0;
};

// ---- tests -------------------------------------------------------------------------------------

class ParityAttention : public ParityTest {
 protected:
  ::testing::AssertionResult topk_matches(const TopkSpec& spec, uint64_t seed) {
    TopkCase c(spec);
    return check_parity(c, cpu(), cuda(), seed);
  }
  // The wgmma sparse MLA kernel's compact cases (SparseMlaWgmmaCompact): P V on the register-A
  // wgmma (pv null) or on mma.sync (pv "mma", DSA_CUDA_SPARSE_MLA_WGMMA_PV, the check path);
  // the token loop's schedule forced (DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE) or left as the process
  // has it (null: a schedule set for the whole run stays set).
  void wgmma_compact_cases(const char* pv, uint64_t seed, const char* schedule = nullptr) {
    ScopedEnv pv_env("DSA_CUDA_SPARSE_MLA_WGMMA_PV", pv);
    std::optional<ScopedEnv> schedule_env;
    if (schedule != nullptr) schedule_env.emplace("DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE", schedule);
    for (int max_splits : {0, 8, 16}) {
      for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
        SparseMlaCase c({dtype, 4, 16, 1300, true, 0, true, max_splits, "wgmma"});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), seed++))
            << "P V on " << (pv != nullptr ? pv : "wgmma") << ", schedule "
            << (schedule != nullptr ? schedule : "as set");
      }
    }
  }
};

struct DtypeVariant {
  KvDtype dtype;
  ScaleRounding rounding;
};
constexpr DtypeVariant kIndexDtypes[] = {{KvDtype::kBf16, ScaleRounding::kExact},
                                         {KvDtype::kFp8, ScaleRounding::kExact},
                                         {KvDtype::kFp8, ScaleRounding::kUe8m0}};
const std::vector<int> kInvarianceRows = {1, 7, 64, 256};

TEST_F(ParityAttention, IndexerLogitsMatchCpu) {
  int cases = 0;
  for (const auto& d : kIndexDtypes) {
    for (int heads : {64, 16, 4}) {
      for (int max_len : {100, 2500}) {
        for (bool padded : {false, true}) {
          IndexerCase c({d.dtype, d.rounding, 7, heads, max_len, padded});
          EXPECT_TRUE(check_parity(c, cpu(), cuda(), 300 + cases++));
        }
      }
    }
  }
  IndexerCase one({KvDtype::kFp8, ScaleRounding::kExact, 1, 64, 33, false});
  EXPECT_TRUE(check_parity(one, cpu(), cuda(), 399));
  // The head weights' scale applied by the op (the model's fused x_proj leaves it to it).
  for (const auto& d : kIndexDtypes) {
    IndexerCase scaled({d.dtype, d.rounding, 5, 64, 2500, true, false, 0.011f});
    EXPECT_TRUE(check_parity(scaled, cpu(), cuda(), 390 + cases++)) << "w_scale";
  }
}

// A page id outside the pool, on both backends: never read, its tokens' logits are 0, and the
// error flag counts one per bad page a row reads (compared exactly, like the logits).
TEST_F(ParityAttention, IndexerLogitsBadPageIdsRaiseTheFlagAlike) {
  int cases = 0;
  for (const auto& d : kIndexDtypes) {
    for (int max_len : {100, 2500}) {
      IndexerCase c({d.dtype, d.rounding, 9, 16, max_len, false, /*bad_pages=*/true});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 500 + cases++));
    }
  }
}

// The CUDA indexer kernel's variants (DSA_CUDA_INDEXER_VARIANT forces one). "resident" and
// "legacy" share their arithmetic (mma.sync, the same head-sum order); "wgmma" sums the heads in
// another fixed order (its warps' partial sums last), so its bits differ from theirs: it is held
// to the CPU's bound and to its own invariance, not compared bitwise with them. "wgmma-n64" is
// "wgmma" with fp8 tiles of 64 tokens instead of 128 (bf16: the same kernel); "wgmma-pipe" another
// fp8 schedule of the same arithmetic (the keys as wgmma's register A, S transposed), bitwise equal
// to "wgmma" (bf16: the same kernel); "wgmma-e4m3" multiplies the e4m3 bytes on the fp8 tensor
// core, other bits held to kLogitsE4m3Nmse (bf16: the "wgmma" kernel).
const char* const kIndexerVariants[] = {"resident",  "legacy",     "wgmma",
                                        "wgmma-n64", "wgmma-pipe", "wgmma-e4m3"};

// Every variant and tokens per block (chosen from the batch; DSA_CUDA_INDEXER_BLOCK_TOKENS forces
// one: from 128 for the wgmma variants, from 512 for the others, which ignore a smaller one) gives
// the CPU's logits, in rows shorter and longer than a block, with every count of
// 16-head m-tiles (1 to 4).
TEST_F(ParityAttention, IndexerLogitsEveryVariantAndBlockSizeMatchesCpu) {
  int cases = 0;
  for (const char* variant : kIndexerVariants) {
    ScopedEnv v("DSA_CUDA_INDEXER_VARIANT", variant);
    for (const char* tokens : {"128", "256", "512", "1024", "2048", "4096", "8192"}) {
      ScopedEnv t("DSA_CUDA_INDEXER_BLOCK_TOKENS", tokens);
      for (const auto& d : {kIndexDtypes[0], kIndexDtypes[1]}) {
        IndexerCase c({d.dtype, d.rounding, 7, 16, 2500, true});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 550 + cases++)) << variant << ", " << tokens;
        IndexerCase long_rows({d.dtype, d.rounding, 3, 4, 20000, false});
        EXPECT_TRUE(check_parity(long_rows, cpu(), cuda(), 550 + cases++))
            << variant << ", " << tokens << " tokens per block";
        IndexerCase wide({d.dtype, d.rounding, 2, 64, 9000, false});
        EXPECT_TRUE(check_parity(wide, cpu(), cuda(), 550 + cases++))
            << variant << ", " << tokens << " tokens per block";
      }
    }
    for (int heads : {32, 48, 20}) {  // m-tiles 2 and 3, and a partial one
      IndexerCase c({KvDtype::kFp8, ScaleRounding::kExact, 5, heads, 700, true});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 550 + cases++)) << variant << ", " << heads;
    }
    IndexerCase bad({KvDtype::kFp8, ScaleRounding::kUe8m0, 9, 64, 2500, false, true});
    EXPECT_TRUE(check_parity(bad, cpu(), cuda(), 550 + cases++)) << variant;
  }
}

// The resident variant in clusters of 1, 2 and 4 blocks (DSA_CUDA_INDEXER_CLUSTER forces one; the
// blocks of a cluster share the query's preparation, and the grid is padded to whole clusters,
// so some blocks lie past every row and only help): the CPU's logits, at short and long blocks.
TEST_F(ParityAttention, IndexerLogitsEveryClusterSizeMatchesCpu) {
  int cases = 0;
  ScopedEnv v("DSA_CUDA_INDEXER_VARIANT", "resident");
  for (const char* ranks : {"1", "2", "4"}) {
    ScopedEnv c("DSA_CUDA_INDEXER_CLUSTER", ranks);
    for (const char* tokens : {"512", "2048"}) {
      ScopedEnv t("DSA_CUDA_INDEXER_BLOCK_TOKENS", tokens);
      for (const auto& d : kIndexDtypes) {
        IndexerCase wide({d.dtype, d.rounding, 7, 64, 2500, true});
        EXPECT_TRUE(check_parity(wide, cpu(), cuda(), 650 + cases++)) << ranks << ", " << tokens;
        IndexerCase narrow({d.dtype, d.rounding, 3, 16, 20000, false});
        EXPECT_TRUE(check_parity(narrow, cpu(), cuda(), 650 + cases++)) << ranks << ", " << tokens;
        IndexerCase bad({d.dtype, d.rounding, 9, 40, 2500, false, /*bad_pages=*/true});
        EXPECT_TRUE(check_parity(bad, cpu(), cuda(), 650 + cases++)) << ranks << ", " << tokens;
      }
    }
  }
}

using Outputs = std::vector<std::vector<uint8_t>>;

// The CUDA outputs of a case with the indexer variant forced, its guards checked.
Outputs variant_outputs(OpCase& c, Workspace& ws, const char* variant) {
  ScopedEnv var("DSA_CUDA_INDEXER_VARIANT", variant);
  auto rb = run_side(c, ws, Side::kCuda);
  EXPECT_EQ(rb.guard_report, "") << variant;
  return std::move(rb.outputs);
}

// Every output of `got` equals the one of `want` byte for byte.
::testing::AssertionResult same_outputs(const Outputs& got, const Outputs& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "output counts differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return ::testing::AssertionFailure() << "output " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

// The mma.sync variants share their arithmetic: the same logits bit for bit (and the same error
// count), at the default and at forced block sizes, in every cluster size, bad page ids and padded
// rows included. (The wgmma variants are not among them: another head-sum order, see
// kIndexerVariants.)
TEST_F(ParityAttention, IndexerLogitsVariantsAgreeBitwise) {
  int cases = 0;
  for (const auto& d : kIndexDtypes) {
    for (int heads : {64, 4}) {
      for (const char* tokens : {"", "512", "8192"}) {
        IndexerCase c({d.dtype, d.rounding, 9, heads, 12000, true, /*bad_pages=*/true});
        Workspace ws(cpu(), cuda());
        testing::Rng rng(700 + cases++);
        c.init(ws, rng);
        ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", *tokens ? tokens : nullptr);
        const Outputs legacy = variant_outputs(c, ws, "legacy");
        for (const char* ranks : {"1", "2", "4"}) {
          ScopedEnv cluster("DSA_CUDA_INDEXER_CLUSTER", ranks);
          EXPECT_TRUE(same_outputs(variant_outputs(c, ws, "resident"), legacy))
              << c.vars() << ", tokens '" << tokens << "', cluster " << ranks
              << ": resident against legacy";
        }
      }
    }
  }
}

// Each variant splits a row into blocks by a rule from the host sizes (the batch, the row length,
// the SM count); the split never enters a logit's arithmetic: every forced block size gives the
// default's bits (and error count), bad page ids, padded rows and partial tiles included.
TEST_F(ParityAttention, IndexerLogitsEveryVariantIsBitwiseEqualAcrossBlockSizes) {
  int cases = 0;
  for (const char* variant : kIndexerVariants) {
    for (const auto& d : kIndexDtypes) {
      IndexerCase c({d.dtype, d.rounding, 5, 64, 9000, true, /*bad_pages=*/true});
      Workspace ws(cpu(), cuda());
      testing::Rng rng(750 + cases++);
      c.init(ws, rng);
      const Outputs reference = variant_outputs(c, ws, variant);
      for (const char* tokens : {"128", "512", "1024", "8192"}) {
        ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", tokens);
        EXPECT_TRUE(same_outputs(variant_outputs(c, ws, variant), reference))
            << variant << ", " << c.vars() << ", tokens " << tokens << " against the default";
      }
    }
  }
}

// The fp8 cache's default kernel (wgmma-e4m3) reading the query's encoding that indexer_query
// wrote (DSA_CUDA_INDEXER_Q=given) gives the bits and the error count of its blocks encoding q
// themselves: a long single row and a batch with padded rows and bad page ids, 64 and 4 heads,
// exact and ue8m0 key scales, the default and forced block sizes; and the CPU's logits.
TEST_F(ParityAttention, IndexerLogitsGivenQueryIsBitwiseTheEncodedOne) {
  int cases = 0;
  for (const auto& d : {kIndexDtypes[1], kIndexDtypes[2]}) {
    for (int heads : {64, 4}) {
      for (int rows : {1, 7}) {
        IndexerSpec spec{d.dtype, d.rounding, rows, heads, rows == 1 ? 20000 : 9000, true, true};
        spec.given_query = true;
        IndexerCase c(spec);
        Workspace ws(cpu(), cuda());
        testing::Rng rng(800 + cases++);
        c.init(ws, rng);
        for (const char* tokens : {"", "512"}) {
          ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", *tokens ? tokens : nullptr);
          const Outputs encoded = variant_outputs(c, ws, "wgmma-e4m3");
          ScopedEnv given("DSA_CUDA_INDEXER_Q", "given");
          EXPECT_TRUE(same_outputs(variant_outputs(c, ws, "wgmma-e4m3"), encoded))
              << c.vars() << ", tokens '" << tokens << "': the given query against the encoded";
        }
      }
    }
    IndexerSpec spec{d.dtype, d.rounding, 5, 64, 3000, false, true};
    spec.given_query = true;
    IndexerCase c(spec);
    ScopedEnv variant("DSA_CUDA_INDEXER_VARIANT", "wgmma-e4m3");
    ScopedEnv given("DSA_CUDA_INDEXER_Q", "given");
    EXPECT_TRUE(check_parity(c, cpu(), cuda(), 820 + cases++)) << c.vars();
  }
}

// The wgmma kernels' blocks take a row's tiles in turn (the default, DSA_CUDA_INDEXER_TILES=
// interleaved: block x of G takes tiles x, x + G, ...) or each a contiguous span
// (DSA_CUDA_INDEXER_TILES=contiguous); every tile runs the same instructions, so both give the
// same bits and error count, at the default and forced block sizes, on rows far shorter than
// their capacity (ld_logits), padded rows, bad page ids and partial tiles included; and the CPU's
// logits with interleaved tiles.
TEST_F(ParityAttention, IndexerLogitsInterleavedTilesAreBitwiseTheContiguous) {
  int cases = 0;
  for (const char* variant : {"wgmma", "wgmma-n64", "wgmma-pipe", "wgmma-e4m3"}) {
    for (const auto& d : kIndexDtypes) {
      if (d.dtype == KvDtype::kBf16 && std::strcmp(variant, "wgmma") != 0) continue;
      IndexerCase c({d.dtype, d.rounding, 6, 64, 30000, true, /*bad_pages=*/true});
      Workspace ws(cpu(), cuda());
      testing::Rng rng(950 + cases++);
      c.init(ws, rng);
      for (const char* tokens : {"", "128", "512", "4096"}) {
        ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", *tokens ? tokens : nullptr);
        Outputs contiguous;
        {
          ScopedEnv tiles("DSA_CUDA_INDEXER_TILES", "contiguous");
          contiguous = variant_outputs(c, ws, variant);
        }
        for (const char* order : {"", "interleaved"}) {
          ScopedEnv tiles("DSA_CUDA_INDEXER_TILES", *order ? order : nullptr);
          EXPECT_TRUE(same_outputs(variant_outputs(c, ws, variant), contiguous))
              << variant << ", " << c.vars() << ", tokens '" << tokens << "', tiles '" << order
              << "'";
        }
      }
    }
    ScopedEnv v("DSA_CUDA_INDEXER_VARIANT", variant);
    ScopedEnv tiles("DSA_CUDA_INDEXER_TILES", "interleaved");
    IndexerCase c({KvDtype::kFp8, ScaleRounding::kExact, 7, 16, 2500, true, true});
    EXPECT_TRUE(check_parity(c, cpu(), cuda(), 970 + cases++)) << variant;
  }
}

// The fp8 cache's kernel (wgmma-e4m3) with each depth of its ring of copies
// (DSA_CUDA_INDEXER_RING: 9 stages at two blocks per SM, 17 at one, their blocks sized to fill
// the GPU once, or the forced block size; auto, the default, picks 6 or 9 from the launch's
// waves) gives the 6-stage ring's bits and error count: a long
// single row (more tiles per block than the ring holds), a batch with padded rows, bad page ids
// and a partial last tile, 64 and 4 heads, exact and ue8m0 key scales, the encoded and the given
// query; and the CPU's logits.
TEST_F(ParityAttention, IndexerLogitsE4m3EveryRingIsBitwiseTheDefault) {
  int cases = 0;
  for (const auto& d : {kIndexDtypes[1], kIndexDtypes[2]}) {
    for (int heads : {64, 4}) {
      // 64 rows of 9000: 1152 blocks of 512 tokens, more than one wave, where auto runs 9 stages.
      for (int rows : {1, 7, 64}) {
        IndexerSpec spec{d.dtype, d.rounding, rows, heads, rows == 1 ? 40000 : 9000, true, true};
        spec.given_query = true;
        IndexerCase c(spec);
        Workspace ws(cpu(), cuda());
        testing::Rng rng(850 + cases++);
        c.init(ws, rng);
        for (const char* query : {"encode", "given"}) {
          ScopedEnv q("DSA_CUDA_INDEXER_Q", query);
          for (const char* tokens : {"", "512", "2048"}) {
            ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", *tokens ? tokens : nullptr);
            Outputs six;
            {
              ScopedEnv depth("DSA_CUDA_INDEXER_RING", "6");
              six = variant_outputs(c, ws, "wgmma-e4m3");
            }
            for (const char* ring : {"auto", "9", "17"}) {
              ScopedEnv depth("DSA_CUDA_INDEXER_RING", std::strcmp(ring, "auto") ? ring : nullptr);
              EXPECT_TRUE(same_outputs(variant_outputs(c, ws, "wgmma-e4m3"), six))
                  << c.vars() << ", query " << query << ", tokens '" << tokens << "', ring " << ring
                  << " against 6";
            }
          }
        }
      }
    }
    for (const char* ring : {"9", "17"}) {
      ScopedEnv variant("DSA_CUDA_INDEXER_VARIANT", "wgmma-e4m3");
      ScopedEnv depth("DSA_CUDA_INDEXER_RING", ring);
      IndexerCase c({d.dtype, d.rounding, 5, 64, 3000, true, true});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 880 + cases++)) << c.vars() << ", ring " << ring;
      IndexerCase one({d.dtype, d.rounding, 1, 64, 40000, false});
      EXPECT_TRUE(check_parity(one, cpu(), cuda(), 880 + cases++)) << c.vars() << ", ring " << ring;
    }
  }
}

// The deeper rings on a small case family for compute-sanitizer (scripts/gpu-ring.sh): padded
// rows, bad page ids, exact and ue8m0 scales, the one-wave block size and a forced one of two
// tiles, against the CPU.
TEST_F(ParityAttention, IndexerLogitsE4m3RingsCompact) {
  int cases = 0;
  ScopedEnv variant("DSA_CUDA_INDEXER_VARIANT", "wgmma-e4m3");
  for (const char* ring : {"9", "17"}) {
    ScopedEnv depth("DSA_CUDA_INDEXER_RING", ring);
    for (const char* tokens : {"", "128"}) {
      ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", *tokens ? tokens : nullptr);
      for (const auto& d : {kIndexDtypes[1], kIndexDtypes[2]}) {
        IndexerCase c({d.dtype, d.rounding, 4, 64, 1500, true, true});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 900 + cases++))
            << c.vars() << ", ring " << ring << ", tokens '" << tokens << "'";
      }
    }
  }
}

// The wgmma variant's token arithmetic does not depend on the instruction's N (the tile width):
// fp8 tiles of 128 and of 64 tokens give the same bits, at the default and a forced block size.
TEST_F(ParityAttention, IndexerLogitsWgmmaTileWidthsAgreeBitwise) {
  int cases = 0;
  for (const auto& d : {kIndexDtypes[1], kIndexDtypes[2]}) {
    for (const char* tokens : {"", "512"}) {
      IndexerCase c({d.dtype, d.rounding, 6, 64, 5000, true, /*bad_pages=*/true});
      Workspace ws(cpu(), cuda());
      testing::Rng rng(780 + cases++);
      c.init(ws, rng);
      ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", *tokens ? tokens : nullptr);
      EXPECT_TRUE(
          same_outputs(variant_outputs(c, ws, "wgmma-n64"), variant_outputs(c, ws, "wgmma")))
          << c.vars() << ", tokens '" << tokens << "': tiles of 64 tokens against 128";
    }
  }
}

// "wgmma-pipe" reschedules the fp8 tile of "wgmma" (the keys widened into registers while the
// previous tile's wgmma run, S^T = K . Q^T, the head sum in registers) without changing a logit's
// arithmetic: the same bits and error count, at the default and forced block sizes (a partial
// last tile, one tile per block, many), with 64 heads and a partial head group, bad page ids and
// padded rows included.
TEST_F(ParityAttention, IndexerLogitsWgmmaPipeAgreesBitwise) {
  int cases = 0;
  for (const auto& d : {kIndexDtypes[1], kIndexDtypes[2]}) {
    for (int heads : {64, 20}) {
      for (const char* tokens : {"", "512", "8192"}) {
        IndexerCase c({d.dtype, d.rounding, 7, heads, 9000, true, /*bad_pages=*/true});
        Workspace ws(cpu(), cuda());
        testing::Rng rng(790 + cases++);
        c.init(ws, rng);
        ScopedEnv size("DSA_CUDA_INDEXER_BLOCK_TOKENS", *tokens ? tokens : nullptr);
        EXPECT_TRUE(
            same_outputs(variant_outputs(c, ws, "wgmma-pipe"), variant_outputs(c, ws, "wgmma")))
            << c.vars() << ", tokens '" << tokens << "': the pipelined schedule against wgmma";
      }
    }
  }
}

TEST_F(ParityAttention, IndexerLogitsBatchInvariant) {
  for (const char* variant : kIndexerVariants) {
    ScopedEnv v("DSA_CUDA_INDEXER_VARIANT", variant);
    for (const auto& d : kIndexDtypes) {
      auto make = [&](int rows) -> std::unique_ptr<OpCase> {
        return std::make_unique<IndexerCase>(
            IndexerSpec{d.dtype, d.rounding, rows, 64, 3000, false});
      };
      EXPECT_TRUE(check_batch_invariance(make, kInvarianceRows, cpu(), cuda())) << variant;
    }
  }
}

TEST_F(ParityAttention, TopkMatchesCpuExactly) {
  int cases = 0;
  for (int k : {2048, 64, 1}) {
    for (Values v : {Values::kNormal, Values::kTies, Values::kSpecials}) {
      for (bool odd : {false, true}) {
        TopkCase c({7, k, 5000, v, !odd, odd});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 500 + cases++));
      }
    }
  }
  // Long rows (CUDA slices them over a cluster of blocks): the shared-memory candidate path
  // (normal values, ties) and the all-global path (few levels put far more than the candidate
  // buffer into the threshold's bin), at V3.2's k and V4's; rows of exactly k and k + 1 leave
  // slices empty.
  for (int k : {2048, 512}) {
    for (Values v : {Values::kNormal, Values::kTies, Values::kSpecials, Values::kFewLevels}) {
      TopkCase c({6, k, 131072, v, true, false});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 600 + cases++));
    }
  }
  TopkCase odd_long({6, 512, 20001, Values::kSpecials, true, true});  // sliced, unaligned rows
  EXPECT_TRUE(check_parity(odd_long, cpu(), cuda(), 650));
  TopkCase small({3, 2048, 100, Values::kNormal, true, true});  // every row has seq_len <= k
  EXPECT_TRUE(check_parity(small, cpu(), cuda(), 700));
  // Past 32 long rows CUDA goes back to one block per row; TopkBatchInvariant crosses the two
  // kernels too (1 and 7 rows sliced, 64 and 256 not).
  TopkCase many_long({40, 2048, 20001, Values::kTies, true, false});
  EXPECT_TRUE(check_parity(many_long, cpu(), cuda(), 750));
}

// The shapes that pick each variant of CUDA's gathering kernel on a 132-SM GPU: 8 CTAs per row
// (6 rows), 4 (20 rows of 64K), 2 (64 rows) and 1 (70 rows), the serving shapes B = 64 at
// L = 32K and 128K, and threshold bins too large to gather (few levels), sliced and whole.
TEST_F(ParityAttention, TopkGatherVariantsMatchCpu) {
  int cases = 0;
  const TopkSpec specs[] = {
      {20, 2048, 65536, Values::kNormal, true, false},
      {20, 512, 65536, Values::kSpecials, false, true},
      {64, 2048, 32768, Values::kNormal, true, false},
      {64, 512, 131072, Values::kNormal, true, false},
      {64, 2048, 32768, Values::kTies, true, false},
      {6, 2048, 131072, Values::kFewLevels, true, false},
      {70, 512, 65536, Values::kFewLevels, true, false},
      {70, 2048, 20001, Values::kSpecials, true, true},
  };
  for (const TopkSpec& spec : specs) EXPECT_TRUE(topk_matches(spec, 800 + cases++));
}

// DSA_CUDA_TOPK=legacy selects the three-pass kernels (kept for comparison): still exact, in
// both their variants (one block per row, and a cluster of 8 per long row).
TEST_F(ParityAttention, TopkLegacyKernelMatchesCpu) {
  setenv("DSA_CUDA_TOPK", "legacy", 1);
  int cases = 0;
  const TopkSpec specs[] = {
      {7, 2048, 5000, Values::kSpecials, true, true},
      {6, 2048, 131072, Values::kTies, true, false},
      {6, 512, 131072, Values::kNormal, true, false},
      {40, 2048, 20001, Values::kTies, true, false},
  };
  for (const TopkSpec& spec : specs) EXPECT_TRUE(topk_matches(spec, 900 + cases++));
  unsetenv("DSA_CUDA_TOPK");
}

TEST_F(ParityAttention, TopkBatchInvariant) {
  for (int k : {2048, 512}) {
    for (Values v : {Values::kNormal, Values::kSpecials}) {
      auto make = [&](int rows) -> std::unique_ptr<OpCase> {
        return std::make_unique<TopkCase>(TopkSpec{rows, k, 40000, v, true, false});
      };
      EXPECT_TRUE(check_batch_invariance(make, kInvarianceRows, cpu(), cuda()));
    }
  }
}

// Every CUDA variant (16, 32 and 64 heads per CTA, and the batch's own choice) against the CPU.
// Row kinds (see SparseMlaCase::init): full rows with sentinel, out-of-range and negative
// indices; short rows (40 used entries: later splits see nothing valid); padded rows (all -1),
// whose output must be exactly 0 and lse -inf (the per-row bound is 0 where the CPU row is 0).
// The spare row after the batch must stay poison.
TEST_F(ParityAttention, SparseMlaMatchesCpu) {
  int cases = 0;
  for (int heads_per_cta : {0, 16, 32, 64}) {
    for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
      for (int heads : {128, 16, 4}) {
        // 37, 100, 150 tokens: 2, 4 and 4 splits of 32-token chunks; at 150 the last split is
        // empty (5 chunks over 4 splits of 2).
        for (int topk : {100, 37, 150}) {
          SparseMlaCase c({dtype, 5, heads, topk, topk == 37, heads_per_cta, true});
          EXPECT_TRUE(check_parity(c, cpu(), cuda(), 800 + cases++));
        }
      }
      // The real topk at 8 splits, 8 chunks each (deeper than every latent ring); row 3 is
      // padded. All 128 heads with the batch's choice; 32 (fewer CPU seconds) with a forced
      // variant.
      const int full_heads = heads_per_cta == 0 ? 128 : 32;
      SparseMlaCase full({dtype, 4, full_heads, 2048, false, heads_per_cta, true, 8});
      EXPECT_TRUE(check_parity(full, cpu(), cuda(), 900 + cases++));
      // 3 chunks per split at 8 splits: fewer than the deeper rings hold.
      SparseMlaCase shallow({dtype, 4, 32, 700, true, heads_per_cta, true, 8});
      EXPECT_TRUE(check_parity(shallow, cpu(), cuda(), 950 + cases++));
    }
  }
}

// One small case per CUDA variant and dtype, for the sanitizers (scripts/gpu-attn.sh): 6 chunks
// per split (the rings wrap; 3 with 16 splits), short, padded and sentinel rows, a spare output
// row; with the default bound (4 splits), 8 (the portable cluster size) and 16 (a non-portable
// cluster).
TEST_F(ParityAttention, SparseMlaVariantsCompact) {
  int cases = 0;
  for (int max_splits : {0, 8, 16}) {
    for (int heads_per_cta : {16, 32, 64}) {
      for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
        SparseMlaCase c({dtype, 4, 16, 1300, true, heads_per_cta, true, max_splits});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 980 + cases++));
      }
    }
  }
}

// A row's bits alone and inside batches of 7, 64 and 256 (padded and short rows among them),
// with the batch's own variant choice and with each variant forced on sizes it would not pick:
// every family compares its rows with those of its 256-row run, so a variant whose per-head
// arithmetic differed from another's would show here.
TEST_F(ParityAttention, SparseMlaBatchInvariant) {
  // heads per CTA at rows 1, 7, 64 and 256 (0: the batch's choice).
  const std::vector<std::vector<int>> mappings = {
      {0, 0, 0, 0}, {16, 32, 16, 0}, {0, 64, 32, 16}, {32, 16, 64, 32}};
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (int topk : {512, 2048}) {
      for (size_t m = 0; m < mappings.size(); ++m) {
        if (topk == 512 && m > 1) continue;
        auto make = [&](int rows) -> std::unique_ptr<OpCase> {
          const size_t at = size_t(std::find(kInvarianceRows.begin(), kInvarianceRows.end(), rows) -
                                   kInvarianceRows.begin());
          return std::make_unique<SparseMlaCase>(
              MlaSpec{dtype, rows, 128, topk, false, mappings[m].at(at)});
        };
        EXPECT_TRUE(check_batch_invariance(make, kInvarianceRows, cpu(), cuda()))
            << "heads per CTA mapping " << m;
      }
    }
    // The same with 16 splits per row in every run (the bound is process-wide).
    auto make16 = [&](int rows) -> std::unique_ptr<OpCase> {
      const size_t at = size_t(std::find(kInvarianceRows.begin(), kInvarianceRows.end(), rows) -
                               kInvarianceRows.begin());
      return std::make_unique<SparseMlaCase>(
          MlaSpec{dtype, rows, 128, 2048, false, mappings[1].at(at), false, 16});
    };
    EXPECT_TRUE(check_batch_invariance(make16, kInvarianceRows, cpu(), cuda())) << "16 splits";
  }
}

// ---- the wgmma kernel (DSA_CUDA_SPARSE_MLA_VARIANT=wgmma) ---------------------------------------
// Its own families: its bits differ from the mma.sync kernel's (another f32 summation order
// inside the tensor cores), within the same tolerances against the CPU.

constexpr const char* kWgmma = "wgmma";

// The CPU's output and lse: every head count (a partial 64-head group: 16 and 4 heads; two
// groups: 128), 2 / 4 / 4 splits of 1-2 chunks (one empty split at 150), the real topk (the
// default 4 splits of 16 chunks: the 3-stage ring wraps), 3 chunks per split (8 splits), and 16
// splits (a non-portable cluster); padded, short, sentinel and out-of-pool slots; strides that are
// not a multiple of 4 floats; a spare output row that must stay poison.
TEST_F(ParityAttention, SparseMlaWgmmaMatchesCpu) {
  int cases = 0;
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (int heads : {128, 16, 4}) {
      for (int topk : {100, 37, 150}) {
        SparseMlaCase c({dtype, 5, heads, topk, topk == 37, 0, true, 0, kWgmma});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 1100 + cases++));
      }
    }
    SparseMlaCase full({dtype, 4, 128, 2048, false, 0, true, 0, kWgmma});
    EXPECT_TRUE(check_parity(full, cpu(), cuda(), 1150 + cases++));
    SparseMlaCase shallow({dtype, 4, 32, 700, true, 0, true, 8, kWgmma});
    EXPECT_TRUE(check_parity(shallow, cpu(), cuda(), 1150 + cases++));
    SparseMlaCase wide({dtype, 3, 128, 2048, true, 0, true, 16, kWgmma});
    EXPECT_TRUE(check_parity(wide, cpu(), cuda(), 1150 + cases++));
  }
}

// One small case per dtype for the sanitizers (scripts/gpu-attn.sh): 6 chunks per split (the
// rings wrap twice), short, padded and sentinel rows, a spare output row; 4, 8 and 16 splits.
TEST_F(ParityAttention, SparseMlaWgmmaCompact) { wgmma_compact_cases(nullptr, 1180); }
// The check path (DSA_CUDA_SPARSE_MLA_WGMMA_PV=mma): passing here but not above points at the
// register-A / MN-major wgmma of P V; failing both, at the rest of the kernel.
TEST_F(ParityAttention, SparseMlaWgmmaPvMmaCompact) { wgmma_compact_cases("mma", 1190); }
// The overlapped token loop (DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE=overlap), whatever the default:
// the sanitizers' case for its rings and barriers (scripts/gpu-attn.sh).
TEST_F(ParityAttention, SparseMlaWgmmaOverlapCompact) {
  wgmma_compact_cases(nullptr, 1195, "overlap");
}

// The CUDA outputs of a wgmma case under one schedule of the token loop, its guards checked.
Outputs schedule_outputs(OpCase& c, Workspace& ws, const char* schedule) {
  ScopedEnv var("DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE", schedule);
  auto rb = run_side(c, ws, Side::kCuda);
  EXPECT_EQ(rb.guard_report, "") << schedule;
  return std::move(rb.outputs);
}

// One shape of the sparse MLA bitwise families below: the batch, heads, topk, odd strides and
// the split bound (0: the default).
struct MlaShape {
  int rows, heads, topk;
  bool padded_stride;
  int max_splits;
};

// The two schedules of the token loop (serial, overlapped) run the same arithmetic: the same
// outputs and lse bit for bit on every shape of the families above: 4, 16, 32 and 128 heads,
// topk 37 to 2048 (empty splits, 1 to 16 chunks per split, the rings wrapping), 4 and 16 splits,
// padded, short, sentinel and out-of-pool slots, odd strides, a spare row that stays poison.
TEST_F(ParityAttention, SparseMlaWgmmaSchedulesAgreeBitwise) {
  std::vector<MlaShape> shapes;
  for (int heads : {128, 16, 4}) {
    for (int topk : {100, 37, 150}) shapes.push_back({5, heads, topk, topk == 37, 0});
  }
  shapes.push_back({4, 128, 2048, false, 0});
  shapes.push_back({4, 32, 700, true, 0});
  shapes.push_back({3, 128, 2048, true, 16});
  shapes.push_back({4, 16, 1300, true, 0});
  shapes.push_back({4, 16, 1300, true, 16});
  uint64_t seed = 1200;
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (const MlaShape& sh : shapes) {
      SparseMlaCase c(
          {dtype, sh.rows, sh.heads, sh.topk, sh.padded_stride, 0, true, sh.max_splits, kWgmma});
      Workspace ws(cpu(), cuda());
      testing::Rng rng(seed++);
      c.init(ws, rng);
      const Outputs serial = schedule_outputs(c, ws, "serial");
      EXPECT_TRUE(same_outputs(schedule_outputs(c, ws, "overlap"), serial))
          << c.vars() << ": overlapped against serial";
    }
  }
}

// A row's bits alone and inside batches of 7, 64 and 256 (padded and short rows among them),
// with 4 (the default), 8 and 16 splits per row.
TEST_F(ParityAttention, SparseMlaWgmmaBatchInvariant) {
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (int topk : {512, 2048}) {
      for (int max_splits : {0, 8, 16}) {
        if (topk == 512 && max_splits == 16) continue;
        auto make = [&](int rows) -> std::unique_ptr<OpCase> {
          return std::make_unique<SparseMlaCase>(
              MlaSpec{dtype, rows, 128, topk, false, 0, false, max_splits, kWgmma});
        };
        EXPECT_TRUE(check_batch_invariance(make, kInvarianceRows, cpu(), cuda()))
            << "wgmma, topk " << topk << ", max_splits " << max_splits;
      }
    }
  }
}

// ---- the 64-token wgmma kernels (DSA_CUDA_SPARSE_MLA_VARIANT=wgmma64 and =ws) -----------------
// Their own families: 64-token chunks, a shared row max per chunk: other bits than the wgmma
// kernel's, within the same tolerances against the CPU. "ws" (warp-specialized) runs wgmma64's
// arithmetic with the warpgroups split by role: the same bits, checked below. On an fp8 cache
// wgmma64 runs the wgmma kernel, and ws expands the chunks to bf16 in its tiles (its bits are then
// ws's on the dequantized bf16 cache, checked below); one fp8 case each below checks either.

constexpr const char* kWgmma64 = "wgmma64";
constexpr const char* kWs = "ws";
constexpr const char* kTokenSplitVariants[] = {kWgmma64, kWs};

// The CPU's output and lse: every head count (a partial 64-head group: 16 and 4 heads; two
// groups: 128); topk 37 (one chunk, fewer than 64 tokens), 100 (2 splits of 1 chunk), 150 (2
// splits of 2 and 1), 300 (4 splits of 2: the last one empty); the real topk (the default 4
// splits of 8: the 2-tile ring and the 3-stage slot ring wrap), 700 (8 splits of 2: the last two
// empty), 16 splits (a non-portable cluster) and 8 (4 chunks per split); padded, short, sentinel,
// negative and out-of-pool slots; strides that are not a multiple of 4 floats; a spare output row
// that must stay poison.
TEST_F(ParityAttention, SparseMlaWgmma64MatchesCpu) {
  for (const char* variant : kTokenSplitVariants) {
    int cases = 0;
    for (int heads : {128, 16, 4}) {
      for (int topk : {100, 37, 150, 300}) {
        SparseMlaCase c({KvDtype::kBf16, 5, heads, topk, topk == 37, 0, true, 0, variant});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), 1300 + cases++)) << c.vars();
      }
    }
    SparseMlaCase full({KvDtype::kBf16, 4, 128, 2048, false, 0, true, 0, variant});
    EXPECT_TRUE(check_parity(full, cpu(), cuda(), 1350 + cases++)) << full.vars();
    SparseMlaCase shallow({KvDtype::kBf16, 4, 32, 700, true, 0, true, 8, variant});
    EXPECT_TRUE(check_parity(shallow, cpu(), cuda(), 1350 + cases++)) << shallow.vars();
    SparseMlaCase wide({KvDtype::kBf16, 3, 128, 2048, true, 0, true, 16, variant});
    EXPECT_TRUE(check_parity(wide, cpu(), cuda(), 1350 + cases++)) << wide.vars();
    SparseMlaCase eight({KvDtype::kBf16, 3, 128, 2048, true, 0, true, 8, variant});
    EXPECT_TRUE(check_parity(eight, cpu(), cuda(), 1350 + cases++)) << eight.vars();
    // wgmma64: the wgmma kernel's; ws: its own fp8 path
    SparseMlaCase fp8({KvDtype::kFp8, 4, 128, 2048, false, 0, true, 0, variant});
    EXPECT_TRUE(check_parity(fp8, cpu(), cuda(), 1350 + cases++)) << fp8.vars();
  }
}

// topk not a multiple of 64: the last chunk partly past topk (its tail rows zero and masked),
// at 2048 - 17 (32 chunks, the last of 47 tokens), 63 and 1 (one chunk, mostly past topk) and
// 65 (a second chunk of one token, in a split of its own).
TEST_F(ParityAttention, SparseMlaWgmma64RaggedTopk) {
  for (const char* variant : kTokenSplitVariants) {
    int cases = 0;
    SparseMlaCase ragged({KvDtype::kBf16, 4, 128, 2048 - 17, true, 0, true, 0, variant});
    EXPECT_TRUE(check_parity(ragged, cpu(), cuda(), 1400 + cases++)) << ragged.vars();
    SparseMlaCase ragged16({KvDtype::kBf16, 3, 64, 2048 - 17, false, 0, true, 16, variant});
    EXPECT_TRUE(check_parity(ragged16, cpu(), cuda(), 1400 + cases++)) << ragged16.vars();
    for (int topk : {63, 1, 65}) {
      SparseMlaCase c({KvDtype::kBf16, 5, 128, topk, true, 0, true, 0, variant});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 1400 + cases++)) << c.vars();
    }
  }
}

// One small case for the sanitizers (scripts/gpu-attn.sh, gpu-check.sh): topk 1697, 27 chunks of
// 64 (the last of 33 tokens), so 7 chunks per split with the default 4 splits, all 27 in one CTA
// with 1, 4 with 8 (both rings wrap; the last split holds 3, the eighth none) and 2 with 16; short,
// padded and sentinel rows, a spare output row. Plus an fp8 cache on the same shape (wgmma64: the
// wgmma kernel; ws: its fp8 path), and ws with 16 heads per CTA (40 heads: 3 groups, the last one
// partial), its q shared through the cluster and copied from L2, bf16 and fp8.
TEST_F(ParityAttention, SparseMlaWgmma64Compact) {
  for (const char* variant : kTokenSplitVariants) {
    uint64_t seed = 1380;
    for (int max_splits : {0, 1, 8, 16}) {
      for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
        SparseMlaCase c({dtype, 4, 16, 1697, true, 0, true, max_splits, variant});
        EXPECT_TRUE(check_parity(c, cpu(), cuda(), seed++)) << c.vars();
      }
    }
    if (variant == kWs) {  // 16 heads per CTA: 40 heads in 3 groups, the last one partial
      SparseMlaCase c({KvDtype::kBf16, 4, 40, 1697, true, 16, true, 0, variant});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), seed++)) << c.vars();
      SparseMlaCase c8({KvDtype::kFp8, 4, 40, 1697, true, 16, true, 0, variant});
      EXPECT_TRUE(check_parity(c8, cpu(), cuda(), seed++)) << c8.vars();
      ScopedEnv q_env("DSA_CUDA_SPARSE_MLA_Q",
                      "l2");  // q from L2 (aligned rows; the others: cluster)
      SparseMlaCase l2({KvDtype::kBf16, 4, 40, 1697, false, 16, true, 0, variant});
      EXPECT_TRUE(check_parity(l2, cpu(), cuda(), seed++)) << l2.vars() << ", q from L2";
      SparseMlaCase l2_8({KvDtype::kFp8, 4, 40, 1697, false, 16, true, 0, variant});
      EXPECT_TRUE(check_parity(l2_8, cpu(), cuda(), seed++)) << l2_8.vars() << ", q from L2";
    }
  }
}

// A probe row (row 0, full) alone, among 7 and among 255 rows (padded and short rows among them),
// bitwise: topk 2048 with 4 (the default), 16 and 8 splits, 2048 - 17 and 512.
TEST_F(ParityAttention, SparseMlaWgmma64BatchInvariant) {
  struct Shape {
    int topk, max_splits;
  };
  for (const char* variant : kTokenSplitVariants) {
    for (const Shape sh :
         {Shape{2048, 0}, Shape{2048, 16}, Shape{2048, 8}, Shape{2048 - 17, 0}, Shape{512, 0}}) {
      auto make = [&](int rows) -> std::unique_ptr<OpCase> {
        return std::make_unique<SparseMlaCase>(
            MlaSpec{KvDtype::kBf16, rows, 128, sh.topk, false, 0, false, sh.max_splits, variant});
      };
      EXPECT_TRUE(check_batch_invariance(make, {1, 7, 255}, cpu(), cuda()))
          << variant << ", topk " << sh.topk << ", max_splits " << sh.max_splits;
    }
  }
}

// The CUDA outputs of a sparse MLA kernel on a shape (its guards checked), with its heads per
// CTA forced (0: the kernel's default); the same seed gives the same inputs.
Outputs token_split_outputs(Backend& cpu, Backend& cuda, const MlaShape& sh, const char* variant,
                            int heads_per_cta, uint64_t seed, KvDtype dtype = KvDtype::kBf16,
                            bool dequantized_pool = false) {
  SparseMlaCase c({dtype, sh.rows, sh.heads, sh.topk, sh.padded_stride, heads_per_cta, true,
                   sh.max_splits, variant, dequantized_pool});
  Workspace ws(cpu, cuda);
  testing::Rng rng(seed);
  c.init(ws, rng);
  auto r = run_side(c, ws, Side::kCuda);
  EXPECT_EQ(r.guard_report, "") << c.vars();
  return std::move(r.outputs);
}

// The shapes of ws's bitwise families: 4, 16, 64 and 128 heads; topk 1, 37 to 2048 and ragged
// (empty splits, 1 to 32 chunks per split, both rings wrapping, a last chunk partly past topk);
// 1, 2, 4, 8 and 16 splits; odd strides.
std::vector<MlaShape> ws_bitwise_shapes() {
  std::vector<MlaShape> shapes;
  for (int heads : {128, 16, 4}) {
    for (int topk : {100, 37, 150, 300}) shapes.push_back({5, heads, topk, topk == 37, 0});
  }
  shapes.push_back({4, 128, 2048, false, 0});
  shapes.push_back({4, 32, 700, true, 0});
  shapes.push_back({3, 128, 2048, true, 16});
  shapes.push_back({3, 128, 2048, true, 8});
  shapes.push_back({4, 128, 2048 - 17, true, 0});
  shapes.push_back({3, 64, 2048 - 17, false, 16});
  shapes.push_back({5, 128, 1, true, 0});
  shapes.push_back({5, 128, 65, true, 0});
  shapes.push_back({4, 16, 1697, true, 0});
  shapes.push_back({3, 128, 2048, true, 1});  // one CTA per row and head group (q: cluster)
  shapes.push_back({4, 64, 2048, false, 1});  // the same, q's rows aligned (q: L2 by default)
  shapes.push_back({4, 40, 2048 - 17, false, 2});
  return shapes;
}

// The warp-specialized kernel gives the 64-token kernel's outputs and lse bit for bit: 4, 16, 64
// and 128 heads; topk 1, 37 to 2048 and ragged (empty splits, 1 to 8 chunks per split, both rings
// wrapping, a last chunk partly past topk); 4, 8 and 16 splits; padded, short, sentinel and
// out-of-pool slots; odd strides; a spare row that stays poison in both.
TEST_F(ParityAttention, SparseMlaWsMatchesWgmma64Bitwise) {
  const std::vector<MlaShape> shapes = ws_bitwise_shapes();
  uint64_t seed = 1500;
  for (const MlaShape& sh : shapes) {
    const Outputs wgmma64 = token_split_outputs(cpu(), cuda(), sh, kWgmma64, 0, seed);
    EXPECT_TRUE(same_outputs(token_split_outputs(cpu(), cuda(), sh, kWs, 0, seed), wgmma64))
        << "rows " << sh.rows << ", heads " << sh.heads << ", topk " << sh.topk << ", max_splits "
        << sh.max_splits << ": ws against wgmma64";
    ++seed;
  }
}

// ws with 16, 32 and 64 heads per CTA (the rest of the tile's 64 rows zero; small batches pick
// 16 or 32 on their own) gives wgmma64's bits: 128 heads (8, 4 or 2 groups), 16 (one group, or
// one full tile) and 40 (a partial last group), 4, 8 and 16 splits, a ragged topk.
TEST_F(ParityAttention, SparseMlaWsHeadsPerCtaBitwise) {
  const std::vector<MlaShape> shapes = {{4, 128, 2048, false, 0},
                                        {3, 128, 2048, true, 16},
                                        {3, 128, 2048 - 17, true, 8},
                                        {5, 16, 150, false, 0},
                                        {4, 40, 700, true, 0}};
  uint64_t seed = 1600;
  for (const MlaShape& sh : shapes) {
    const Outputs wgmma64 = token_split_outputs(cpu(), cuda(), sh, kWgmma64, 0, seed);
    for (int heads_per_cta : {16, 32, 64}) {
      EXPECT_TRUE(
          same_outputs(token_split_outputs(cpu(), cuda(), sh, kWs, heads_per_cta, seed), wgmma64))
          << "rows " << sh.rows << ", heads " << sh.heads << ", topk " << sh.topk << ", max_splits "
          << sh.max_splits << ": ws with " << heads_per_cta << " heads per CTA against wgmma64";
    }
    ++seed;
  }
}

// ws with q copied from L2 by every CTA (DSA_CUDA_SPARSE_MLA_Q=l2, the default for aligned rows)
// and shared through the cluster (=cluster) gives wgmma64's bits either way: 64 and 16 heads per
// CTA, 4 and 16 splits, 40 heads (a partial group), and odd strides (q's rows not 16-byte aligned:
// the cluster's way under either value, the same bits).
TEST_F(ParityAttention, SparseMlaWsQFromL2Bitwise) {
  const std::vector<MlaShape> shapes = {{4, 128, 2048, false, 0},
                                        {3, 128, 2048, false, 16},
                                        {4, 40, 700, false, 0},
                                        {5, 128, 150, true, 0}};
  uint64_t seed = 1700;
  for (const MlaShape& sh : shapes) {
    const Outputs wgmma64 = token_split_outputs(cpu(), cuda(), sh, kWgmma64, 0, seed);
    for (const char* q : {"l2", "cluster"}) {
      ScopedEnv q_env("DSA_CUDA_SPARSE_MLA_Q", q);
      for (int heads_per_cta : {64, 16}) {
        EXPECT_TRUE(
            same_outputs(token_split_outputs(cpu(), cuda(), sh, kWs, heads_per_cta, seed), wgmma64))
            << "rows " << sh.rows << ", heads " << sh.heads << ", topk " << sh.topk
            << ", max_splits " << sh.max_splits << ", padded " << sh.padded_stride << ": ws with q "
            << q << " and " << heads_per_cta << " heads per CTA against wgmma64";
      }
    }
    ++seed;
  }
}

// ws on an fp8 cache (DSA_CUDA_SPARSE_MLA_VARIANT=ws): the chunk's e4m3 values, scales and rope
// land inside its bf16 tile and warpgroup 1 expands them there, so its outputs must be ws's on a
// bf16 cache holding the dequantized values, bit for bit (the same S, P and P V operands): every
// shape of SparseMlaWsMatchesWgmma64Bitwise (1 to 2048 selected, empty splits, both rings wrapping,
// a last chunk partly past topk, 1, 2, 4, 8 and 16 splits, padded, short, sentinel, negative and
// out-of-pool slots, odd strides, a spare row that stays poison), and on the first shapes with 16
// and 32 heads per CTA and q copied from L2.
TEST_F(ParityAttention, SparseMlaWsFp8MatchesDequantizedBf16Bitwise) {
  const std::vector<MlaShape> shapes = ws_bitwise_shapes();
  uint64_t seed = 1750;
  for (size_t i = 0; i < shapes.size(); ++i, ++seed) {
    const MlaShape& sh = shapes[i];
    const Outputs bf16 =
        token_split_outputs(cpu(), cuda(), sh, kWs, 0, seed, KvDtype::kBf16, /*dequantized=*/true);
    EXPECT_TRUE(
        same_outputs(token_split_outputs(cpu(), cuda(), sh, kWs, 0, seed, KvDtype::kFp8), bf16))
        << "rows " << sh.rows << ", heads " << sh.heads << ", topk " << sh.topk << ", max_splits "
        << sh.max_splits << ": ws on fp8 against ws on the dequantized bf16 cache";
    if (i >= 3) continue;  // heads per CTA and q's source: the first shapes (128 heads)
    for (int heads_per_cta : {16, 32}) {
      EXPECT_TRUE(same_outputs(
          token_split_outputs(cpu(), cuda(), sh, kWs, heads_per_cta, seed, KvDtype::kFp8), bf16))
          << "topk " << sh.topk << ": ws on fp8 with " << heads_per_cta << " heads per CTA";
    }
    if (!sh.padded_stride) {
      ScopedEnv q_env("DSA_CUDA_SPARSE_MLA_Q", "l2");
      EXPECT_TRUE(
          same_outputs(token_split_outputs(cpu(), cuda(), sh, kWs, 0, seed, KvDtype::kFp8), bf16))
          << "topk " << sh.topk << ": ws on fp8 with q from L2";
    }
  }
}

// ws on an fp8 cache against the CPU (the fp8 tolerances: c rounded to bf16 after the scale):
// 128, 16 and 4 heads, topk 37 to 2048, 4, 8 and 16 splits, padded, short, sentinel and
// out-of-pool slots, a spare row; and a probe row's bits alone, among 7 and among 255.
TEST_F(ParityAttention, SparseMlaWsFp8MatchesCpu) {
  int cases = 0;
  for (int heads : {128, 4}) {
    for (int topk : {37, 150, 300}) {
      SparseMlaCase c({KvDtype::kFp8, 5, heads, topk, topk == 37, 0, true, 0, kWs});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 1800 + cases++)) << c.vars();
    }
  }
  for (int max_splits : {0, 8, 16}) {
    SparseMlaCase c({KvDtype::kFp8, 3, 128, 2048 - 17, true, 0, true, max_splits, kWs});
    EXPECT_TRUE(check_parity(c, cpu(), cuda(), 1800 + cases++)) << c.vars();
  }
  for (int topk : {2048, 2048 - 17}) {
    auto make = [&](int rows) -> std::unique_ptr<OpCase> {
      return std::make_unique<SparseMlaCase>(
          MlaSpec{KvDtype::kFp8, rows, 128, topk, false, 0, false, 0, kWs});
    };
    EXPECT_TRUE(check_batch_invariance(make, {1, 7, 255}, cpu(), cuda()))
        << "ws, fp8, topk " << topk;
  }
}

// The wgmma kernel (the fp8 caches' kernel) with 16 and 32 heads per CTA gives its 64-head bits,
// bf16 and fp8: 128 heads, 40 (a partial group), 4 and 16 splits.
TEST_F(ParityAttention, SparseMlaWgmmaHeadsPerCtaBitwise) {
  const std::vector<MlaShape> shapes = {{3, 128, 2048, true, 0}, {4, 40, 700, true, 16}};
  uint64_t seed = 1650;
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (const MlaShape& sh : shapes) {
      const Outputs full = token_split_outputs(cpu(), cuda(), sh, kWgmma, 64, seed, dtype);
      for (int heads_per_cta : {16, 32}) {
        EXPECT_TRUE(same_outputs(
            token_split_outputs(cpu(), cuda(), sh, kWgmma, heads_per_cta, seed, dtype), full))
            << kv_dtype_name(dtype) << ", rows " << sh.rows << ", heads " << sh.heads << ", topk "
            << sh.topk << ", max_splits " << sh.max_splits << ": " << heads_per_cta
            << " heads per CTA against 64";
      }
      ++seed;
    }
  }
}

// ws and the wgmma kernel with their heads per CTA chosen by the batch
// (DSA_CUDA_SPARSE_MLA_HEADS=auto: at 4 splits 16 at 1 row, 32 at 7, 64 at 255): a probe row's
// bits alone, among 7 and among 255; ws at 4 and 8 splits, the wgmma kernel bf16 and fp8.
TEST_F(ParityAttention, SparseMlaAutoHeadsInvariant) {
  struct Run {
    const char* variant;
    KvDtype dtype;
    int max_splits;
  };
  for (const Run run : {Run{kWs, KvDtype::kBf16, 0}, Run{kWs, KvDtype::kBf16, 8},
                        Run{kWgmma, KvDtype::kBf16, 0}, Run{kWgmma, KvDtype::kFp8, 0}}) {
    auto make = [&](int rows) -> std::unique_ptr<OpCase> {
      return std::make_unique<SparseMlaCase>(
          MlaSpec{run.dtype, rows, 128, 2048, false, -1, false, run.max_splits, run.variant});
    };
    EXPECT_TRUE(check_batch_invariance(make, {1, 7, 255}, cpu(), cuda()))
        << run.variant << ", " << kv_dtype_name(run.dtype) << ", heads per CTA from the batch, "
        << "max_splits " << run.max_splits;
  }
}

// ---- the heads-as-N kernel (DSA_CUDA_SPARSE_MLA_VARIANT=hn) -----------------------------------
// Its own family: 16 heads per CTA on wgmma's N, the chunk's 64 tokens on M (S^T = K Q^T, O^T +=
// V^T P^T), the column maxima over four warps, per-thread l sums: other bits than every other
// kernel, within the same tolerances against the CPU, batch-invariant on their own.

constexpr const char* kHn = "hn";

// The CPU's output and lse: 128, 16 and 4 heads (8, 1 and a partial group); topk 37 to 300 (one
// chunk, empty splits), the real topk at the default 4 splits and at 1, 2, 8 and 16 (a
// non-portable cluster), ragged topks (2048 - 17, 63, 1, 65); padded, short, sentinel, negative
// and out-of-pool slots; odd strides (q's rows not 16-byte aligned: q loaded without cp.async);
// a spare output row that must stay poison. bf16 and fp8 caches.
TEST_F(ParityAttention, SparseMlaHnMatchesCpu) {
  int cases = 0;
  for (int heads : {128, 16, 4}) {
    for (int topk : {100, 37, 150, 300}) {
      SparseMlaCase c({KvDtype::kBf16, 5, heads, topk, topk == 37, 0, true, 0, kHn});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 2000 + cases++)) << c.vars();
    }
  }
  for (int max_splits : {0, 1, 2, 8, 16}) {
    for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
      SparseMlaCase c({dtype, 3, 128, 2048, max_splits == 8, 0, true, max_splits, kHn});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), 2000 + cases++)) << c.vars();
    }
  }
  for (int topk : {2048 - 17, 63, 1, 65}) {
    SparseMlaCase c({KvDtype::kBf16, 5, 128, topk, true, 0, true, 0, kHn});
    EXPECT_TRUE(check_parity(c, cpu(), cuda(), 2000 + cases++)) << c.vars();
  }
  SparseMlaCase fp8({KvDtype::kFp8, 4, 40, 2048 - 17, false, 0, true, 8, kHn});
  EXPECT_TRUE(check_parity(fp8, cpu(), cuda(), 2000 + cases++)) << fp8.vars();
}

// One small case for the sanitizers (scripts/gpu-mla.sh): topk 1697, 27 chunks of 64 (the last of
// 33 tokens): 7 chunks per split at the default 4 splits, all 27 in one CTA at 1 (the ring wraps
// 13 times), 4 at 8 (the eighth split empty) and 2 at 16; 40 heads (3 groups, the last of 8);
// short, padded and sentinel rows, a spare output row; bf16 and fp8, q's rows aligned or not.
TEST_F(ParityAttention, SparseMlaHnCompact) {
  uint64_t seed = 2100;
  for (int max_splits : {0, 1, 8, 16}) {
    for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
      SparseMlaCase c({dtype, 4, 40, 1697, max_splits % 2 == 0, 0, true, max_splits, kHn});
      EXPECT_TRUE(check_parity(c, cpu(), cuda(), seed++)) << c.vars();
    }
  }
}

// A probe row (row 0, full) alone, among 7 and among 255 rows (padded and short rows among them),
// bitwise: topk 2048 at 4 (the default), 8, 16 and 1 splits, 2048 - 17 and 512; an fp8 cache.
TEST_F(ParityAttention, SparseMlaHnBatchInvariant) {
  struct Shape {
    KvDtype dtype;
    int topk, max_splits;
  };
  for (const Shape sh : {Shape{KvDtype::kBf16, 2048, 0}, Shape{KvDtype::kBf16, 2048, 8},
                         Shape{KvDtype::kBf16, 2048, 16}, Shape{KvDtype::kBf16, 2048, 1},
                         Shape{KvDtype::kBf16, 2048 - 17, 0}, Shape{KvDtype::kBf16, 512, 0},
                         Shape{KvDtype::kFp8, 2048, 8}}) {
    auto make = [&](int rows) -> std::unique_ptr<OpCase> {
      return std::make_unique<SparseMlaCase>(
          MlaSpec{sh.dtype, rows, 128, sh.topk, false, 0, false, sh.max_splits, kHn});
    };
    EXPECT_TRUE(check_batch_invariance(make, {1, 7, 255}, cpu(), cuda()))
        << "hn, " << kv_dtype_name(sh.dtype) << ", topk " << sh.topk << ", max_splits "
        << sh.max_splits;
  }
}

// hn on an fp8 cache expands each chunk to bf16 in its tile as ws does (sparse_mla_tile64.cuh), so
// its outputs are hn's on a bf16 cache holding the dequantized values, bit for bit, on every shape
// of ws's bitwise family.
TEST_F(ParityAttention, SparseMlaHnFp8MatchesDequantizedBf16Bitwise) {
  const std::vector<MlaShape> shapes = ws_bitwise_shapes();
  uint64_t seed = 2200;
  for (const MlaShape& sh : shapes) {
    const Outputs bf16 =
        token_split_outputs(cpu(), cuda(), sh, kHn, 0, seed, KvDtype::kBf16, /*dequantized=*/true);
    EXPECT_TRUE(
        same_outputs(token_split_outputs(cpu(), cuda(), sh, kHn, 0, seed, KvDtype::kFp8), bf16))
        << "rows " << sh.rows << ", heads " << sh.heads << ", topk " << sh.topk << ", max_splits "
        << sh.max_splits << ": hn on fp8 against hn on the dequantized bf16 cache";
    ++seed;
  }
}

}  // namespace
}  // namespace dsa::parity
