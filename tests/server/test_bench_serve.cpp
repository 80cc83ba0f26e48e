// dsa bench-serve against an in-process server: plain prompts and agent sessions complete, the
// metrics are consistent with the records, and --check finds a guarded server clean.
#include <cmath>

#include "dsa/bench_serve.h"
#include "dsa/error.h"
#include "server_fixture.h"

namespace dsa::server::testing {
namespace {

class BenchServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TinyOptions t;
    t.context = 1024;
    t.pages = 120;
    server_ = new TestServer({}, t);
    ASSERT_TRUE(server_->wait_ready());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  bench::BenchOptions options() const {
    bench::BenchOptions o;
    o.url = "http://127.0.0.1:" + std::to_string(server_->port());
    o.input_len = 6;
    o.output_len = 5;
    o.concurrency = 4;
    return o;
  }
  static TestServer* server_;
};
TestServer* BenchServe::server_ = nullptr;

TEST_F(BenchServe, PlainPromptsReportConsistentMetrics) {
  bench::BenchOptions o = options();
  o.num_prompts = 8;
  o.request_rate = 50;  // Poisson arrivals
  o.slo_ttft_ms = 1e9;
  int last_done = 0;
  const bench::BenchReport r = bench::run_bench(o, [&](int done, int total, const char*) {
    EXPECT_LE(done, total);
    last_done = done;
  });
  EXPECT_EQ(last_done, 8);
  EXPECT_EQ(r.completed, 8);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.output_tokens, 8 * 5);  // ignore_eos: exactly max_tokens each
  EXPECT_GT(r.input_tokens, 8 * 6);   // BOS plus at least a token a word
  EXPECT_NEAR(r.output_throughput, r.output_tokens / r.duration_s, 1e-6);
  EXPECT_NEAR(r.goodput, r.request_throughput, 1e-9);  // every request within a huge SLO
  EXPECT_GT(r.ttft_ms.median, 0);
  EXPECT_LE(r.ttft_ms.median, r.e2el_ms.median);
  EXPECT_LE(r.ttft_ms.median, r.ttft_ms.p99);
  size_t gaps = 0;
  for (const bench::RequestRecord& rec : r.records) {
    EXPECT_LE(rec.itl_s.size(), 4u) << "at most one gap between two of the five tokens";
    gaps += rec.itl_s.size();
  }
  EXPECT_GT(gaps, 0u);
  const std::string table = bench::bench_table(o, r);
  EXPECT_NE(table.find("Successful requests:"), std::string::npos);
  EXPECT_NE(table.find("P99 ITL (ms):"), std::string::npos);
  const nlohmann::json j = bench::bench_json(o, r);
  EXPECT_EQ(j["completed"], 8);
  EXPECT_NE(bench::bench_cdf_svg(r).find("<polyline"), std::string::npos);
}

TEST_F(BenchServe, AgentSessionsAreCheckedCleanOnAGuardedServer) {
  bench::BenchOptions o = options();
  o.sessions = 2;
  o.min_turns = 2;
  o.max_turns = 2;
  o.temperature = 0.6;  // seeded per session and turn
  o.check = true;
  const bench::BenchReport r = bench::run_bench(o);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.completed, 4);
  ASSERT_TRUE(r.checked);
  EXPECT_EQ(r.check.sessions, 2);
  EXPECT_EQ(r.check.corrupted, 0);
  EXPECT_EQ(r.check.replayed_requests, r.completed);
  // Every later turn carries the earlier replies in its history.
  for (const bench::RequestRecord& rec : r.records) {
    const nlohmann::json body = nlohmann::json::parse(rec.body);
    EXPECT_EQ(body["messages"].size(), size_t(2 + 2 * rec.turn)) << rec.session << "/" << rec.turn;
    EXPECT_EQ(body["tools"].size(), 2u);
  }
  EXPECT_NE(bench::bench_table(o, r).find("| guarded server | 0/2 (0%) |"), std::string::npos);
}

TEST(BenchServeOptions, BadOptionsAndAnUnreachableServerAreClearErrors) {
  bench::BenchOptions o;
  o.url = "ftp://127.0.0.1:1";
  EXPECT_THROW(bench::run_bench(o), Error);
  o.url = "http://127.0.0.1:1";
  o.concurrency = 0;
  EXPECT_THROW(bench::run_bench(o), Error);
  o.concurrency = 1;
  try {
    bench::run_bench(o);
    FAIL() << "no server listens on port 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

TEST(BenchPercentiles, InterpolateBetweenRanks) {
  const bench::Percentiles p = bench::percentiles({4, 1, 3, 2, 5});
  EXPECT_DOUBLE_EQ(p.mean, 3);
  EXPECT_DOUBLE_EQ(p.median, 3);
  EXPECT_DOUBLE_EQ(p.p90, 4.6);
  EXPECT_NEAR(p.p99, 4.96, 1e-12);
}

}  // namespace
}  // namespace dsa::server::testing
