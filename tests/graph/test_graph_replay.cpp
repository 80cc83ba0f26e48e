// Graph replay against eager (DESIGN §4), the incident's faults (§5) and the detectors (§6), on
// the CPU backend. The same tests run through real CUDA graphs in tests/parity when a GPU exists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "common/test_util.h"
#include "dsa/auditor.h"
#include "dsa/error.h"
#include "dsa/replay_check.h"
#include "dsa/runner.h"
#include "graph/graph_fixture.h"

namespace dsa {
namespace {

using testing::changed_slots;
using testing::GraphFixture;
using testing::kWithLogits;
using testing::micro_config;
using testing::snapshot;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GraphReplay : public ::testing::TestWithParam<KvDtype> {};

TEST_P(GraphReplay, FiveRowsAfterSixteenMatchEagerAndWriteOnlyTheirSlots) {
  GraphFixture f(micro_config(), GetParam(), /*buckets=*/{4, 16});
  f.start_requests(16, /*seed=*/7);
  const auto full = f.decode_rows({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  StepResult g16 = f.graph->step(full, kWithLogits);
  StepResult e16 = f.eager->step(full, kWithLogits);
  ASSERT_EQ(g16.bucket, 16);
  EXPECT_TRUE(same_bits(g16.logits, e16.logits));
  EXPECT_EQ(g16.tokens, e16.tokens);
  f.advance({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, g16);

  // Garbage in every padded input: wild slots, positions, page ids, NaN-free but absurd values.
  f.graph->plant_garbage_inputs(99);
  const auto before = snapshot(*f.backend, *f.graph_cache);
  const std::vector<int> five = {3, 8, 9, 12, 15};
  const auto rows = f.decode_rows(five);
  StepResult g5 = f.graph->step(rows, kWithLogits);
  StepResult e5 = f.eager->step(rows, kWithLogits);
  ASSERT_EQ(g5.bucket, 16);
  EXPECT_EQ(g5.store_errors, 0);
  EXPECT_TRUE(same_bits(g5.logits, e5.logits));
  EXPECT_EQ(g5.tokens, e5.tokens);
  for (float v : g5.logits) ASSERT_TRUE(std::isfinite(v));

  std::set<int64_t> expected;
  for (const RowInput& r : rows) expected.insert(r.slot);
  EXPECT_EQ(changed_slots(*f.graph_cache, before, snapshot(*f.backend, *f.graph_cache)), expected);
}

TEST_P(GraphReplay, BatchAboveLargestBucketRunsEagerly) {
  GraphFixture f(micro_config(), GetParam(), /*buckets=*/{1, 2, 4});
  f.start_requests(6, /*seed=*/3);
  const auto rows = f.decode_rows({0, 1, 2, 3, 4, 5});
  StepResult g = f.graph->step(rows, kWithLogits);
  StepResult e = f.eager->step(rows, kWithLogits);
  EXPECT_EQ(g.bucket, 0);
  EXPECT_TRUE(same_bits(g.logits, e.logits));
  EXPECT_EQ(g.tokens, e.tokens);
}

TEST_P(GraphReplay, EachRowDrawsWithItsOwnSamplingInsideTheReplay) {
  GraphFixture f(micro_config(), GetParam(), /*buckets=*/{4, 16});
  f.start_requests(6, /*seed=*/5);
  const auto rows = f.decode_rows({0, 1, 2, 3, 4, 5});
  std::vector<RowSampling> sampling;
  for (int k = 0; k < 6; ++k) {
    sampling.push_back(
        {{k % 2 ? 0.8f : 0.0f, k % 3 ? 0.9f : 1.0f, uint64_t(100 + k)}, uint64_t(7 * k)});
  }
  const StepResult g = f.graph->step(rows, kWithLogits.with_sampling(sampling));
  const StepResult e = f.eager->step(rows, kWithLogits.with_sampling(sampling));
  ASSERT_EQ(g.bucket, 16);
  EXPECT_EQ(g.tokens, e.tokens);
  const size_t vocab = size_t(f.model->config().vocab_size);
  for (size_t k = 0; k < rows.size(); ++k) {
    const std::span<const float> logits(g.logits.data() + k * vocab, vocab);
    EXPECT_EQ(g.tokens[k], sample_token(logits, sampling[k].params, sampling[k].index)) << k;
  }
  EXPECT_THROW(f.graph->step(rows, StepOutputs().with_sampling(std::span(sampling).first(2))),
               Error);
  EXPECT_THROW(f.graph->step(rows, StepOutputs().with_logprobs()),
               Error);  // the runner computes none

  // A runner built for log-probs returns log softmax(logits)[token]; rerunning the same rows
  // rewrites the eager cache's slots with the same bytes.
  RunnerOptions with_logprobs;
  with_logprobs.logprobs = true;
  Runner lp(*f.model, *f.eager_cache, with_logprobs);
  const StepResult l = lp.step(rows, StepOutputs().with_sampling(sampling).with_logprobs());
  EXPECT_EQ(l.tokens, e.tokens);
  ASSERT_EQ(l.logprobs.size(), rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    double sum = 0;
    for (size_t i = 0; i < vocab; ++i) sum += std::exp(double(e.logits[k * vocab + i]));
    const double want = double(e.logits[k * vocab + size_t(l.tokens[k])]) - std::log(sum);
    EXPECT_NEAR(l.logprobs[k], want, 1e-5) << k;
  }
}

TEST_P(GraphReplay, CaptureRecordsWithoutRunning) {
  // Recording the buckets must not touch the cache: with the incident's unguarded store, a run
  // at capture time would scatter the all-padding rows into the pool's last slot.
  GraphFixture f(micro_config(), GetParam(), /*buckets=*/{2, 8}, FaultSet{true, true});
  const auto now = snapshot(*f.backend, *f.graph_cache);
  for (const auto& pool : now) {
    for (uint8_t b : pool) ASSERT_EQ(b, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(IndexK, GraphReplay, ::testing::Values(KvDtype::kBf16, KvDtype::kFp8),
                         [](const auto& p) { return std::string(kv_dtype_name(p.param)); });

// ---- the randomized sequence and the incident ------------------------------------------------

ReplayCheckReport run_check(KvDtype index_k, int steps, FaultSet faults,
                            RunMode mode = RunMode::kGraph) {
  return testing::run_micro_check(BackendKind::kCpu, index_k, steps, faults, mode);
}

TEST(GraphReplayRandomized, TenThousandStepsKeepParityAndAuditClean) {
  const ReplayCheckReport r = run_check(KvDtype::kBf16, 10000, FaultSet{});
  EXPECT_EQ(r.steps, 10000);
  EXPECT_EQ(r.parity_mismatches, 0) << "first at step " << r.first_parity_mismatch_step;
  EXPECT_EQ(r.store_errors, 0);
  EXPECT_TRUE(r.findings.empty()) << r.findings.front().describe();
  // The sequence really wandered across buckets and audited what it wrote.
  EXPECT_GE(r.bucket_histogram.size(), 5u);
  EXPECT_GT(r.audited_slots, 10000);
}

TEST(GraphReplayIncident, Bf16GraphWithBothFaultsIsCaughtAndVictimsNamed) {
  const ReplayCheckReport r = run_check(KvDtype::kBf16, 400, FaultSet{true, true});
  ASSERT_FALSE(r.findings.empty()) << "the auditor missed the incident";
  EXPECT_FALSE(r.victims.empty());
  for (const AuditFinding& f : r.findings) {
    EXPECT_EQ(f.pool, PoolKind::kIndexK) << f.describe();  // only the unguarded writer clobbers
    EXPECT_GT(f.owner, 0);
    EXPECT_GE(f.detected_step, f.written_step);
  }
}

TEST(GraphReplayIncident, Fp8WithBothFaultsStaysClean) {
  const ReplayCheckReport r = run_check(KvDtype::kFp8, 400, FaultSet{true, true});
  EXPECT_TRUE(r.findings.empty()) << r.findings.front().describe();
  EXPECT_EQ(r.parity_mismatches, 0);
}

TEST(GraphReplayIncident, EagerWithBothFaultsStaysClean) {
  const ReplayCheckReport r = run_check(KvDtype::kBf16, 400, FaultSet{true, true}, RunMode::kEager);
  EXPECT_TRUE(r.findings.empty()) << r.findings.front().describe();
  EXPECT_EQ(r.bucket_histogram.count(0), 1u);
  EXPECT_EQ(r.bucket_histogram.size(), 1u);
}

TEST(GraphReplayIncident, EachFaultAloneIsHarmlessToTheGuardedWriterOrWithoutStaleRows) {
  // Stale padding alone: the guarded writer rejects the stale rows (rule 1).
  EXPECT_TRUE(run_check(KvDtype::kBf16, 300, FaultSet{true, false}).findings.empty());
  // The unguarded writer alone: padded rows carry -1, which wraps to the pool's last slot; that
  // slot is the only one that can ever be hit.
  const ReplayCheckReport r = run_check(KvDtype::kBf16, 300, FaultSet{false, true});
  const int64_t last_slot = (1 + 16 * 2) * kPageSize - 1;
  for (const AuditFinding& f : r.findings) EXPECT_EQ(f.slot, last_slot) << f.describe();
}

}  // namespace
}  // namespace dsa
