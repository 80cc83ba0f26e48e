// The prefix cache behind dsa serve: a resent prompt reports its cached tokens in usage, the
// metrics count queries, hits and cached pages apart from owned ones, the reply is the same with
// the cache on and off, and bench-serve's agent sessions hit the cache and replay clean.
#include "dsa/bench_serve.h"
#include "server_fixture.h"

namespace dsa::server::testing {
namespace {

constexpr int kPage = 64;  // tokens per page (DESIGN §1)

// A prompt of well over two pages in the tiny tokenizer.
std::string long_prompt() {
  std::string p;
  for (int i = 0; i < 24; ++i) p += "the agent reads file " + std::to_string(i) + " and ";
  return p;
}

json greedy_body(const std::string& prompt) {
  return {{"model", "dsa"},   {"prompt", prompt},   {"max_tokens", 12},
          {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
}

// The value of an unlabelled sample in a Prometheus text body; -1 when absent.
double metric(const std::string& body, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + body).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(body.substr(at + key.size() - 1));
}

struct Reply {
  std::string text;
  int prompt_tokens = 0, cached_tokens = 0;
};
Reply complete(TestServer& s, const std::string& prompt) {
  auto r = s.post("/v1/completions", greedy_body(prompt));
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  return {j["choices"][0]["text"], j["usage"]["prompt_tokens"],
          j["usage"]["prompt_tokens_details"]["cached_tokens"]};
}

TEST(ServerPrefixCache, AResentPromptIsServedFromTheCacheWithTheSameReply) {
  TinyOptions on;
  on.prefix_cache = true;
  TestServer cached({}, on);
  TestServer plain({}, TinyOptions{});
  ASSERT_TRUE(cached.wait_ready());
  ASSERT_TRUE(plain.wait_ready());
  const std::string prompt = long_prompt();

  const Reply first = complete(cached, prompt);
  ASSERT_GT(first.prompt_tokens, 2 * kPage) << "the prompt must span two full pages";
  EXPECT_EQ(first.cached_tokens, 0) << "nothing is cached before the first request";
  ASSERT_TRUE(cached.wait_idle());
  const ServerSnapshot idle = cached.server().snapshot();
  EXPECT_GT(idle.cached_pages, 0) << "the finished request's full pages stay cached";
  EXPECT_EQ(idle.free_pages + idle.cached_pages, idle.total_pages - 1)
      << "idle: every page is free or cached";

  const Reply second = complete(cached, prompt);
  // Whole pages only, and always at least the last prompt token is prefilled.
  EXPECT_GE(second.cached_tokens, 2 * kPage);
  EXPECT_EQ(second.cached_tokens % kPage, 0);
  EXPECT_LT(second.cached_tokens, second.prompt_tokens);
  EXPECT_EQ(second.prompt_tokens, first.prompt_tokens);
  EXPECT_EQ(second.text, first.text) << "a cached prefix must give the reply a prefill gives";

  const Reply uncached = complete(plain, prompt);
  EXPECT_EQ(uncached.cached_tokens, 0);
  EXPECT_EQ(uncached.text, first.text) << "cache on and off disagree";

  const std::string m = cached.client().Get("/metrics")->body;
  EXPECT_EQ(metric(m, "dsa:prefix_cache_queries_total"), 2.0 * first.prompt_tokens);
  EXPECT_EQ(metric(m, "dsa:prefix_cache_hits_total"), double(second.cached_tokens));
  EXPECT_GT(metric(m, "dsa:prefix_cache_usage_perc"), 0.0);
  EXPECT_EQ(metric(m, "dsa:kv_cache_usage_perc"), 0.0) << "idle: no page is owned";
  const std::string off = plain.client().Get("/metrics")->body;
  EXPECT_EQ(metric(off, "dsa:prefix_cache_hits_total"), 0.0);
  EXPECT_EQ(metric(off, "dsa:prefix_cache_usage_perc"), 0.0);
}

TEST(ServerPrefixCache, AgentSessionsHitTheCacheAndReplayClean) {
  TinyOptions t;
  t.prefix_cache = true;
  t.context = 1024;
  t.pages = 120;
  TestServer s({}, t);
  ASSERT_TRUE(s.wait_ready());
  bench::BenchOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(s.port());
  o.sessions = 3;
  o.min_turns = 3;
  o.max_turns = 3;
  o.input_len = 40;  // the first prompt alone passes a full page
  o.output_len = 8;
  o.concurrency = 3;
  o.temperature = 0;
  o.tools = false;  // short prompts: every turn of every session fits the context
  o.check = true;   // every session replayed alone: the cache is warm by then
  const bench::BenchReport r = bench::run_bench(o);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.completed, 9);
  EXPECT_EQ(r.context_ended, 0);
  EXPECT_GT(r.cached_tokens, 0) << "later turns resend their history";
  EXPECT_LT(r.cached_tokens, r.input_tokens);
  for (const bench::RequestRecord& rec : r.records) {
    EXPECT_FALSE(nlohmann::json::parse(rec.body).contains("tools")) << "--no-tools sent tools";
    if (rec.turn == 0) continue;
    EXPECT_GT(rec.cached_tokens, 0) << "session " << rec.session << " turn " << rec.turn;
  }
  EXPECT_GT(r.ttft_late_ms.median, 0);
  ASSERT_TRUE(r.checked);
  EXPECT_EQ(r.check.corrupted, 0);
  const std::string table = bench::bench_table(o, r);
  EXPECT_NE(table.find("Prefix cache hit rate:"), std::string::npos);
  EXPECT_NE(table.find("Median TTFT, turns >= 3 (ms):"), std::string::npos);
  EXPECT_NE(table.find("Sessions cut at the context:"), std::string::npos);
  EXPECT_GT(bench::bench_json(o, r)["prefix_cache_hit_rate"].get<double>(), 0.0);
}

}  // namespace
}  // namespace dsa::server::testing
