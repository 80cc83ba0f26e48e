// dsa serve over real HTTP on 127.0.0.1: health while loading, SSE framing and order, streaming
// equal to non-streaming, batch-invariant seeded sampling under 64 concurrent clients, stop
// strings, clients that drop mid-stream, the queue limit, metrics, ids, auth and fault injection.
#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "server_fixture.h"

namespace dsa::server::testing {
namespace {

json completion_body(const std::string& prompt, int max_tokens, uint64_t seed, bool stream) {
  json b = {{"model", "dsa"},           {"prompt", prompt}, {"max_tokens", max_tokens},
            {"temperature", 0.8},       {"seed", seed},     {"ignore_eos", true},
            {"return_token_ids", true}, {"stream", stream}};
  if (stream) b["stream_options"] = {{"include_usage", true}};
  return b;
}

// The text and finish reason of a streamed completion or chat reply.
struct Streamed {
  std::string text;
  std::string finish_reason;
  std::vector<int32_t> token_ids;
  json usage;
};
Streamed collect(const std::vector<std::string>& events, bool chat) {
  Streamed s;
  EXPECT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    if (c["choices"].empty()) {  // the usage chunk: last before [DONE]
      EXPECT_EQ(i + 2, events.size()) << "a usage chunk that is not last";
      s.usage = c["usage"];
      continue;
    }
    EXPECT_TRUE(s.finish_reason.empty()) << "a chunk after the finish chunk";
    const json& choice = c["choices"][0];
    EXPECT_EQ(choice["index"], 0);
    if (chat) {
      if (i == 0) {
        EXPECT_EQ(choice["delta"]["role"], "assistant") << "the first chunk's role";
      }
      if (choice["delta"].contains("content")) s.text += choice["delta"]["content"];
    } else {
      s.text += choice["text"].get<std::string>();
    }
    if (!choice["finish_reason"].is_null()) {
      s.finish_reason = choice["finish_reason"];
      if (choice.contains("token_ids")) {
        s.token_ids = choice["token_ids"].get<std::vector<int32_t>>();
      }
    }
  }
  EXPECT_FALSE(s.finish_reason.empty()) << "no finish chunk";
  return s;
}

class ServerHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions o;
    o.max_queue = 256;
    TinyOptions t;
    t.max_rows = 64;
    t.pages = 200;
    server_ = new TestServer(o, t);
    ASSERT_TRUE(server_->wait_ready());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TestServer* server_;
};
TestServer* ServerHttp::server_ = nullptr;

TEST(ServerLoad, HealthIsUnavailableWhileTheModelLoadsThenOk) {
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  TestServer s({}, {}, [gate] { gate.wait(); });
  auto before = s.client().Get("/health");
  ASSERT_TRUE(before);
  EXPECT_EQ(before->status, 503);
  const json error = json::parse(before->body)["error"];
  EXPECT_EQ(error["type"], "unavailable_error");
  EXPECT_EQ(error["message"], "Loading model");
  auto early = s.post("/v1/completions", completion_body("hi", 2, 1, false));
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 503);
  EXPECT_TRUE(early->has_header("Retry-After"));
  release.set_value();
  ASSERT_TRUE(s.wait_ready());
  auto after = s.client().Get("/health");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
  EXPECT_EQ(json::parse(after->body), json({{"status", "ok"}}));
}

TEST_F(ServerHttp, CompletionStreamIsFramedInOrderAndEqualsTheNonStreamingReply) {
  auto whole = server_->post("/v1/completions", completion_body("The cache page", 12, 7, false));
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["object"], "text_completion");
  EXPECT_EQ(w["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(w["usage"]["completion_tokens"], 12);
  EXPECT_EQ(w["usage"]["total_tokens"],
            w["usage"]["prompt_tokens"].get<int>() + w["usage"]["completion_tokens"].get<int>());
  EXPECT_EQ(w["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  auto streamed = server_->post("/v1/completions", completion_body("The cache page", 12, 7, true));
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  const Streamed s = collect(sse_events(streamed->body), false);
  EXPECT_EQ(s.text, w["choices"][0]["text"]);
  EXPECT_EQ(s.token_ids, w["choices"][0]["token_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(s.finish_reason, "length");
  EXPECT_EQ(s.usage, w["usage"]);
}

TEST_F(ServerHttp, ChatStreamEqualsTheNonStreamingReply) {
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Name a page size."}}});
  json body = {{"messages", messages},
               {"max_completion_tokens", 10},
               {"temperature", 0.7},
               {"seed", 11},
               {"ignore_eos", true}};
  auto whole = server_->post("/v1/chat/completions", body);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["object"], "chat.completion");
  EXPECT_EQ(w["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(w["choices"][0]["finish_reason"], "length");
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto streamed = server_->post("/v1/chat/completions", body);
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  const std::vector<std::string> events = sse_events(streamed->body);
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(json::parse(events[i])["object"], "chat.completion.chunk");
  }
  const Streamed s = collect(events, true);
  EXPECT_EQ(s.text, w["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.usage, w["usage"]);
}

TEST_F(ServerHttp, SixtyFourConcurrentClientsGetTheirSequentialReplies) {
  // Seeded sampling at temperature > 0 is batch-invariant: each request's text alone equals its
  // text among 63 others.
  constexpr int kClients = 64;
  auto body = [](int i) {
    return completion_body(
        "request " + std::to_string(i) + " reads slot " + std::to_string(i * 7 % 13), 6,
        1000 + uint64_t(i), false);
  };
  std::vector<std::string> alone(kClients);
  for (int i = 0; i < kClients; ++i) {
    auto r = server_->post("/v1/completions", body(i));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    alone[size_t(i)] = json::parse(r->body)["choices"][0]["text"];
  }
  std::vector<std::string> together(kClients);
  std::vector<std::thread> clients;
  std::vector<std::string> errors(kClients);
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto r = server_->post("/v1/completions", body(i));
      if (!r) {
        errors[size_t(i)] = "transport: " + httplib::to_string(r.error());
      } else if (r->status != 200) {
        errors[size_t(i)] = "status " + std::to_string(r->status) + ": " + r->body;
      } else {
        together[size_t(i)] = json::parse(r->body)["choices"][0]["text"];
      }
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(errors[size_t(i)], "") << "client " << i;
  int distinct = int(std::set<std::string>(alone.begin(), alone.end()).size());
  EXPECT_GT(distinct, kClients / 2) << "the replies should differ between requests";
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << i;
}

TEST_F(ServerHttp, StopStringsEndTheTextBeforeThem) {
  auto full = server_->post("/v1/completions", completion_body("stop here", 16, 5, false));
  ASSERT_TRUE(full);
  ASSERT_EQ(full->status, 200);
  const std::string text = json::parse(full->body)["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  // A stop string of two whole characters from the middle of the reply: the text ends right
  // before its first occurrence.
  auto next_char = [&](size_t i) {
    for (++i; i < text.size() && (uint8_t(text[i]) & 0xC0) == 0x80;) ++i;
    return i;
  };
  size_t begin = text.size() / 2;
  while (begin > 0 && (uint8_t(text[begin]) & 0xC0) == 0x80) --begin;
  const std::string stop = text.substr(begin, next_char(next_char(begin)) - begin);
  json body = completion_body("stop here", 16, 5, false);
  body["stop"] = json::array({stop});
  auto cut = server_->post("/v1/completions", body);
  ASSERT_TRUE(cut);
  ASSERT_EQ(cut->status, 200);
  const json c = json::parse(cut->body);
  EXPECT_EQ(c["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  body["stream"] = true;
  auto cut_streamed = server_->post("/v1/completions", body);
  ASSERT_TRUE(cut_streamed);
  const Streamed s = collect(sse_events(cut_streamed->body), false);
  EXPECT_EQ(s.text, text.substr(0, text.find(stop)));
  EXPECT_EQ(s.finish_reason, "stop");
  EXPECT_TRUE(server_->wait_idle());
}

TEST_F(ServerHttp, AClientThatDropsMidStreamLeavesNoPageBehind) {
  ASSERT_TRUE(server_->wait_idle());
  const ServerSnapshot start = server_->server().snapshot();
  ASSERT_EQ(start.free_pages, start.total_pages - 1);
  const int64_t generated_before = start.stats.generated_tokens;
  httplib::Client c = server_->client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = completion_body("a long reply", 400, 3, true).dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  c.send(req, res, error);
  EXPECT_EQ(error, httplib::Error::Canceled);
  ASSERT_TRUE(server_->wait_idle());
  const ServerSnapshot end = server_->server().snapshot();
  EXPECT_EQ(end.free_pages, start.free_pages);
  EXPECT_LT(end.stats.generated_tokens - generated_before, 400) << "the request ran to its end";
  const std::string metrics = server_->client().Get("/metrics")->body;
  EXPECT_EQ(metrics.find("dsa:request_success_total{finished_reason=\"abort\"} 0"),
            std::string::npos);
}

TEST_F(ServerHttp, IdsAreUniqueAndEveryResponseNamesItsRequest) {
  std::set<std::string> ids;
  for (int i = 0; i < 10; ++i) {
    auto r = server_->post("/v1/completions", completion_body("id", 1, uint64_t(i), false));
    ASSERT_TRUE(r);
    const std::string id = json::parse(r->body)["id"];
    EXPECT_EQ(r->get_header_value("X-Request-Id"), id);
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 10u);
}

TEST_F(ServerHttp, ModelsTokenizeAndDetokenize) {
  auto models = server_->client().Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["data"][0]["id"], "dsa");
  EXPECT_EQ(m["data"][0]["max_model_len"], 512);
  auto tok =
      server_->post("/tokenize", json{{"prompt", "paged caches"}, {"add_special_tokens", false}});
  ASSERT_TRUE(tok);
  ASSERT_EQ(tok->status, 200) << tok->body;
  const json t = json::parse(tok->body);
  EXPECT_EQ(t["tokens"], tiny_tokenizer()->encode("paged caches"));
  EXPECT_EQ(t["count"], t["tokens"].size());
  auto detok = server_->post("/detokenize", json{{"tokens", t["tokens"]}});
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["prompt"], "paged caches");
}

// The exposition format: comments, then "name{labels} value" samples with valid names.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      EXPECT_TRUE(line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) << line;
      continue;
    }
    const size_t space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    const std::string key = line.substr(0, space);
    const std::string name = key.substr(0, key.find('{'));
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_:"), std::string::npos)
        << line;
    EXPECT_EQ(name.rfind("dsa:", 0), 0u) << line;
    samples[key] = std::stod(line.substr(space + 1));
  }
  return samples;
}

TEST_F(ServerHttp, MetricsParseAsPrometheusTextAndMove) {
  auto before = parse_prometheus(server_->client().Get("/metrics")->body);
  ASSERT_TRUE(server_->post("/v1/completions", completion_body("count me", 5, 2, false)));
  ASSERT_TRUE(server_->wait_idle());
  auto metrics = server_->client().Get("/metrics");
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  auto after = parse_prometheus(metrics->body);
  EXPECT_EQ(after["dsa:generation_tokens_total"] - before["dsa:generation_tokens_total"], 5);
  EXPECT_EQ(after["dsa:request_success_total{finished_reason=\"length\"}"] -
                before["dsa:request_success_total{finished_reason=\"length\"}"],
            1);
  EXPECT_EQ(after["dsa:time_to_first_token_seconds_count"] -
                before["dsa:time_to_first_token_seconds_count"],
            1);
  EXPECT_EQ(after["dsa:inter_token_latency_seconds_count"] -
                before["dsa:inter_token_latency_seconds_count"],
            4);
  for (const char* gauge :
       {"dsa:num_requests_running", "dsa:num_requests_waiting", "dsa:kv_cache_usage_perc",
        "dsa:store_errors_total", "dsa:padded_rows_total", "dsa:auditor_findings_total",
        "dsa:num_preemptions_total", "dsa:prompt_tokens_total"}) {
    EXPECT_EQ(after.count(gauge), 1u) << gauge;
  }
  EXPECT_GT(after["dsa:padded_rows_total"] + after["dsa:graph_replays_total{bucket=\"1\"}"], 0);
  // Histograms: cumulative buckets ending in +Inf == _count.
  for (const char* h : {"dsa:time_to_first_token_seconds", "dsa:e2e_request_latency_seconds",
                        "dsa:time_per_output_token_seconds", "dsa:inter_token_latency_seconds"}) {
    const std::string name = h;
    double previous = 0;
    for (const auto& [key, value] : after) {
      if (key.rfind(name + "_bucket{", 0) != 0) continue;
      EXPECT_GE(value, 0);
      (void)previous;
    }
    EXPECT_EQ(after[name + "_bucket{le=\"+Inf\"}"], after[name + "_count"]) << name;
    EXPECT_GE(after[name + "_sum"], 0) << name;
  }
}

TEST(ServerQueue, AFullQueueAnswers429AndTheServerKeepsServing) {
  ServerOptions o;
  o.max_queue = 0;
  TinyOptions t;
  t.max_running = 1;
  TestServer s(o, t);
  ASSERT_TRUE(s.wait_ready());
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, release = false;
  std::thread holder([&] {
    httplib::Client c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = completion_body("hold the slot", 400, 1, true).dump();
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      std::unique_lock lock(mu);
      started = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
      return false;  // then drop
    };
    httplib::Response res;
    httplib::Error error;
    c.send(req, res, error);
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return started; }));
  }
  auto full = s.post("/v1/completions", completion_body("no room", 2, 1, false));
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 429);
  EXPECT_EQ(full->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(full->body)["error"]["type"], "rate_limit_error");
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  holder.join();
  ASSERT_TRUE(s.wait_idle());
  auto after = s.post("/v1/completions", completion_body("room again", 2, 1, false));
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
}

TEST(ServerAuth, TheApiKeyGuardsTheApiButNotHealth) {
  ServerOptions o;
  o.api_key = "sesame";
  TestServer s(o);
  ASSERT_TRUE(s.wait_ready());
  EXPECT_EQ(s.client().Get("/health")->status, 200);
  const json body = completion_body("key", 2, 1, false);
  auto none = s.post("/v1/completions", body);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["type"], "authentication_error");
  auto wrong = s.post("/v1/completions", body.dump(), {{"Authorization", "Bearer nope"}});
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(s.client().Get("/v1/models")->status, 401);
  auto right = s.post("/v1/completions", body.dump(), {{"Authorization", "Bearer sesame"}});
  EXPECT_EQ(right->status, 200) << right->body;
}

TEST(ServerFaults, FaultInjectionIsAnnouncedOnEveryResponse) {
  ServerOptions o;
  o.fault_injection = "stale-padding,unguarded-store";
  TinyOptions t;
  t.faults = parse_faults("incident");
  TestServer s(o, t);
  ASSERT_TRUE(s.wait_ready());
  std::vector<httplib::Result> results;
  results.push_back(s.client().Get("/health"));
  results.push_back(s.client().Get("/metrics"));
  results.push_back(s.client().Get("/nope"));
  results.push_back(s.post("/v1/completions", completion_body("f", 2, 1, false)));
  results.push_back(s.post("/v1/completions", std::string("{")));
  for (const httplib::Result& r : results) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->get_header_value("X-Dsa-Fault-Injection"), "stale-padding,unguarded-store")
        << r->status;
  }
}

}  // namespace
}  // namespace dsa::server::testing
