// Parity of the sample op: the CUDA kernel draws exactly the CPU reference's tokens (greedy and
// seeded top-p, over vocabularies of 256 to V3.2's 129,280), log-probs agree within the rounding
// of one sum, and a row's draw is the same alone, among 7 and among 255 rows.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

constexpr double kLogprobNmse = 1e-12;  // one double sum in another order, then rounded to f32

// Row r's kind, by r alone, so every row count sees the same rows.
enum class RowKind { kGreedy, kNucleus, kFull, kFlat, kCold, kSpecial };
RowKind kind_of(int r) {
  static constexpr RowKind kinds[] = {RowKind::kNucleus, RowKind::kGreedy, RowKind::kFull,
                                      RowKind::kCold,    RowKind::kFlat,   RowKind::kSpecial};
  return kinds[r % 6];
}

class SampleCase final : public OpCase {
 public:
  // shared: a workspace kept across cases (sized for the most rows), else the case's own.
  SampleCase(int rows, int vocab, bool logprobs, DeviceArray<uint8_t>* shared = nullptr)
      : rows_(rows), vocab_(vocab), logprobs_(logprobs), shared_(shared) {}
  std::string name() const override { return "sample"; }
  std::string vars() const override {
    return "rows=" + std::to_string(rows_) + ",vocab=" + std::to_string(vocab_) +
           (logprobs_ ? ",logprobs" : "");
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    ld_ = vocab_ + 3;
    std::vector<float> logits(size_t(rows_) * ld_), temperature(rows_), top_p(rows_);
    std::vector<uint64_t> seed(rows_), index(rows_);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int r = 0; r < rows_; ++r) {  // row by row, so row prefixes match across sizes
      float* l = logits.data() + size_t(r) * ld_;
      for (int i = 0; i < ld_; ++i) l[i] = rng.normal(3.0f);
      temperature[r] = rng.uniform(0.3f, 1.6f);
      top_p[r] = rng.uniform(0.05f, 0.98f);
      seed[r] = uint64_t(rng.integer(0, int64_t(1) << 62));
      index[r] = uint64_t(rng.integer(0, 1 << 20));
      switch (kind_of(r)) {
        case RowKind::kGreedy:
          temperature[r] = 0.0f;
          break;
        case RowKind::kFull:
          top_p[r] = 1.0f;
          break;
        case RowKind::kFlat:  // many equal weights: the cut's ties all join the nucleus
          for (int i = 0; i < vocab_; ++i) l[i] = float(rng.integer(0, 3)) * 0.5f;
          temperature[r] = 1.0f;
          break;
        case RowKind::kCold:  // nearly greedy: most weights round to 0
          temperature[r] = 0.02f;
          break;
        case RowKind::kNucleus:
          break;
        case RowKind::kSpecial: {
          const int which = (r / 6) % 4;
          if (which == 0) {  // NaNs sprinkled, never drawn
            for (int i = 0; i < vocab_; i += 3) l[i] = nan;
          } else if (which == 1) {  // every logit NaN: no token
            for (int i = 0; i < vocab_; ++i) l[i] = nan;
          } else if (which == 2) {  // an infinite top wins outright
            l[vocab_ / 2] = INFINITY;
            l[vocab_ / 3] = -INFINITY;
          } else {  // a tie for the top between two ids: the lower wins greedily
            l[vocab_ - 1] = 50.0f;
            l[vocab_ / 4] = 50.0f;
            temperature[r] = 0.0f;
          }
          break;
        }
      }
    }
    logits_ = ws.input(logits);
    temperature_ = ws.input(temperature);
    top_p_ = ws.input(top_p);
    seed_ = ws.input(seed);
    index_ = ws.input(index);
    tokens_ = ws.output<int32_t>(size_t(rows_), Check::exact());
    logprobs_out_ = ws.output<float>(size_t(rows_), Check::nmse(kLogprobNmse));
  }
  void run(Workspace& ws, Side side) override {
    Backend& be = ws.backend(side);
    const size_t bytes = be.sample_workspace_bytes(rows_, vocab_);
    DeviceArray<uint8_t>& scratch = shared_ ? *shared_ : scratch_;
    if (side == Side::kCuda && scratch.size() < bytes) {
      scratch = DeviceArray<uint8_t>(be, bytes);
      be.fill(scratch.data(), 0, bytes);  // zero when first allocated, as the op requires
    }
    SampleParams p;
    p.logits = ws.ptr(logits_, side);
    p.temperature = ws.ptr(temperature_, side);
    p.top_p = ws.ptr(top_p_, side);
    p.seed = ws.ptr(seed_, side);
    p.index = ws.ptr(index_, side);
    p.tokens = ws.ptr(tokens_, side);
    p.logprobs = logprobs_ ? ws.ptr(logprobs_out_, side) : nullptr;
    p.workspace = side == Side::kCuda ? scratch.data() : nullptr;
    p.rows = rows_;
    p.vocab = vocab_;
    p.ld_logits = ld_;
    be.sample(p);
  }

 private:
  int rows_, vocab_;
  bool logprobs_;
  int64_t ld_ = 0;
  Buf<float> logits_, temperature_, top_p_, logprobs_out_;
  Buf<uint64_t> seed_, index_;
  Buf<int32_t> tokens_;
  DeviceArray<uint8_t>* shared_;
  DeviceArray<uint8_t> scratch_;
};

class ParitySample : public ParityTest {};

TEST_F(ParitySample, DrawsTheCpuTokensExactly) {
  for (int vocab : {256, 4097, 32768, 129280}) {
    for (int rows : {1, 7, 48}) {
      SampleCase c(rows, vocab, /*logprobs=*/true);
      EXPECT_TRUE(check_parity(c, cpu(), cuda()));
    }
  }
  SampleCase tokens_only(12, 32768, /*logprobs=*/false);
  EXPECT_TRUE(check_parity(tokens_only, cpu(), cuda()));
}

TEST_F(ParitySample, ManySeedsAgree) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    SampleCase c(30, 1000, /*logprobs=*/false);
    EXPECT_TRUE(check_parity(c, cpu(), cuda(), seed));
  }
}

// One workspace through launches of different row counts (the runner's graph buckets share one):
// each launch must leave its per-row chunk counters at zero for the next, whatever its rows.
TEST_F(ParitySample, OneWorkspaceAcrossRowCounts) {
  DeviceArray<uint8_t> shared;
  for (int rows : {48, 7, 48, 1, 30}) {
    SampleCase c(rows, 32768, /*logprobs=*/rows % 2 == 0, &shared);
    EXPECT_TRUE(check_parity(c, cpu(), cuda(), 700 + rows));
  }
}

TEST_F(ParitySample, BatchInvariant) {
  for (int vocab : {256, 32768}) {
    EXPECT_TRUE(check_batch_invariance(
        [vocab](int rows) { return std::make_unique<SampleCase>(rows, vocab, true); }, {1, 7, 255},
        cpu(), cuda()));
  }
}

}  // namespace
}  // namespace dsa::parity
