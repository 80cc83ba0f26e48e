// The graph-runner tests of tests/graph, through real CUDA graphs (stream capture, instantiate,
// launch) on the CUDA backend. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "common/restore_env.h"
#include "dsa/replay_check.h"
#include "graph/graph_fixture.h"

namespace dsa {
namespace {

using testing::GraphFixture;
using testing::kWithLogits;
using testing::micro_config;

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ParityGraph : public ::testing::TestWithParam<KvDtype> {};

// 16 rows through the bucket-16 graph and eagerly, then 5 of them (bucket 16 again, padded):
// the same bits as eager each time, and only the 5 new tokens' slots written.
void five_rows_after_sixteen(KvDtype index_k) {
  GraphFixture f(micro_config(), index_k, {4, 16}, {}, BackendKind::kCuda);
  f.start_requests(16, 7);
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const auto full = f.decode_rows(all);
  StepResult g16 = f.graph->step(full, kWithLogits);
  StepResult e16 = f.eager->step(full, kWithLogits);
  ASSERT_EQ(g16.bucket, 16);
  EXPECT_TRUE(same_bits(g16.logits, e16.logits));
  EXPECT_EQ(g16.tokens, e16.tokens);
  f.advance(all, g16);

  f.graph->plant_garbage_inputs(99);
  const auto before = testing::snapshot(*f.backend, *f.graph_cache);
  const auto rows = f.decode_rows({3, 8, 9, 12, 15});
  StepResult g5 = f.graph->step(rows, kWithLogits);
  StepResult e5 = f.eager->step(rows, kWithLogits);
  EXPECT_EQ(g5.store_errors, 0);
  EXPECT_TRUE(same_bits(g5.logits, e5.logits));
  EXPECT_EQ(g5.tokens, e5.tokens);

  // Only the five new tokens' slots changed, exactly, in every pool of every layer.
  std::set<int64_t> expected;
  for (const RowInput& r : rows) expected.insert(r.slot);
  EXPECT_EQ(
      testing::changed_slots(*f.graph_cache, before, testing::snapshot(*f.backend, *f.graph_cache)),
      expected);
}

TEST_P(ParityGraph, FiveRowsAfterSixteenMatchEagerAndWriteOnlyTheirSlots) {
  REQUIRE_GPU();
  five_rows_after_sixteen(GetParam());
}

// The same with the wgmma sparse MLA kernel (DSA_CUDA_SPARSE_MLA_VARIANT=wgmma for the whole
// test, graphs captured with it): a row's bits in a padded graph bucket equal its eager bits.
TEST_P(ParityGraph, WgmmaSparseMlaFiveRowsAfterSixteenMatchEager) {
  REQUIRE_GPU();
  struct Variant {
    Variant() { setenv("DSA_CUDA_SPARSE_MLA_VARIANT", "wgmma", 1); }
    ~Variant() { unsetenv("DSA_CUDA_SPARSE_MLA_VARIANT"); }
  } variant;
  five_rows_after_sixteen(GetParam());
}

// Programmatic dependent launch (DSA_CUDA_PDL=on for the whole test, graphs captured with it):
// each kernel launches while the one before it finishes and waits for it before its first access,
// so a row's bits in a padded graph bucket still equal its eager bits.
TEST_P(ParityGraph, PdlFiveRowsAfterSixteenMatchEager) {
  REQUIRE_GPU();
  testing::RestoreEnv restore({"DSA_CUDA_PDL"});
  setenv("DSA_CUDA_PDL", "on", 1);
  five_rows_after_sixteen(GetParam());
}

// The logits and tokens of 16 rows' first graph step, and of a second step of 5 of them (padded
// in bucket 16), with the knob `name` set to `value` while the fixture is built and run.
std::vector<StepResult> two_graph_steps(KvDtype index_k, const char* name, const char* value) {
  testing::RestoreEnv restore({name});
  setenv(name, value, 1);
  GraphFixture f(micro_config(), index_k, {4, 16}, {}, BackendKind::kCuda);
  if (std::strcmp(name, "DSA_CUDA_INDEXER_Q") == 0) {  // the knob reaches the model's choice
    EXPECT_EQ(f.backend->reads_fp8_index_query(), std::strcmp(value, "given") == 0);
  }
  f.start_requests(16, 7);
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<StepResult> steps;
  steps.push_back(f.graph->step(f.decode_rows(all), kWithLogits));
  f.advance(all, steps.back());
  steps.push_back(f.graph->step(f.decode_rows({3, 8, 9, 12, 15}), kWithLogits));
  return steps;
}

void expect_same_steps(const std::vector<StepResult>& a, const std::vector<StepResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(same_bits(a[i].logits, b[i].logits)) << "step " << i;
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "step " << i;
    EXPECT_FALSE(a[i].logits.empty());
  }
}

// The same steps with and without PDL give the same bits (only the time between kernels moves).
TEST_P(ParityGraph, PdlGivesTheBitsOfPlainStreamOrder) {
  REQUIRE_GPU();
  expect_same_steps(two_graph_steps(GetParam(), "DSA_CUDA_PDL", "off"),
                    two_graph_steps(GetParam(), "DSA_CUDA_PDL", "on"));
}

// With an fp8 index-K cache and DSA_CUDA_INDEXER_Q=given, the model has indexer_query write the
// query's fp8 encoding and the indexer's blocks read it instead of encoding q themselves: the same
// bytes, so the steps give the bits of the blocks' own encoding (bf16 caches: the knob does
// nothing, and the steps must not move either).
TEST_P(ParityGraph, GivenIndexQueryGivesTheBitsOfTheBlocksEncoding) {
  REQUIRE_GPU();
  expect_same_steps(two_graph_steps(GetParam(), "DSA_CUDA_INDEXER_Q", "encode"),
                    two_graph_steps(GetParam(), "DSA_CUDA_INDEXER_Q", "given"));
}

// The side lane on its own stream (the default) against every op on one stream
// (DSA_CUDA_LANES=off): the indexer and the stores run beside the query projections, as a parallel
// branch of the captured graph, and the steps keep their bits; with PDL on as well.
TEST_P(ParityGraph, LanesGiveTheBitsOfOneStream) {
  REQUIRE_GPU();
  expect_same_steps(two_graph_steps(GetParam(), "DSA_CUDA_LANES", "off"),
                    two_graph_steps(GetParam(), "DSA_CUDA_LANES", "on"));
  testing::RestoreEnv restore({"DSA_CUDA_PDL"});
  setenv("DSA_CUDA_PDL", "on", 1);
  expect_same_steps(two_graph_steps(GetParam(), "DSA_CUDA_LANES", "off"),
                    two_graph_steps(GetParam(), "DSA_CUDA_LANES", "on"));
}

INSTANTIATE_TEST_SUITE_P(IndexK, ParityGraph, ::testing::Values(KvDtype::kBf16, KvDtype::kFp8),
                         [](const auto& p) { return std::string(kv_dtype_name(p.param)); });

ReplayCheckReport run_cuda_check(KvDtype index_k, int steps, FaultSet faults,
                                 RunMode mode = RunMode::kGraph) {
  return testing::run_micro_check(BackendKind::kCuda, index_k, steps, faults, mode);
}

TEST(ParityGraphRandomized, TenThousandStepsKeepParityAndAuditClean) {
  REQUIRE_GPU();
  const ReplayCheckReport r = run_cuda_check(KvDtype::kBf16, 10000, {});
  EXPECT_EQ(r.parity_mismatches, 0) << "first at step " << r.first_parity_mismatch_step;
  EXPECT_EQ(r.store_errors, 0);
  EXPECT_TRUE(r.findings.empty()) << r.findings.front().describe();
  EXPECT_GE(r.bucket_histogram.size(), 5u);
}

TEST(ParityGraphIncident, FingerprintThroughRealGraphs) {
  REQUIRE_GPU();
  const ReplayCheckReport bad = run_cuda_check(KvDtype::kBf16, 400, {true, true});
  EXPECT_FALSE(bad.findings.empty()) << "the auditor kernel missed the incident";
  EXPECT_FALSE(bad.victims.empty());
  EXPECT_TRUE(run_cuda_check(KvDtype::kFp8, 400, {true, true}).findings.empty());
  EXPECT_TRUE(run_cuda_check(KvDtype::kBf16, 400, {true, true}, RunMode::kEager).findings.empty());
  EXPECT_TRUE(run_cuda_check(KvDtype::kBf16, 400, {}).findings.empty());
}

}  // namespace
}  // namespace dsa
