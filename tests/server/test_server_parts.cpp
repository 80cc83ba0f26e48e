// The server's parts without HTTP: stop strings on streamed text, tool calls from generated
// tokens through the per-request parser (streamed deltas against the whole message), ids.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "dsa/text/chat.h"
#include "server/chat.h"
#include "server/generation.h"
#include "server_fixture.h"

namespace dsa::server::testing {
namespace {

std::string stream_all(TextStream& s, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += s.push(id);
  return out + s.finish();
}

TEST(TextStream, StopStringsMatchAcrossTokensAndHoldNothingBack) {
  const auto tok = tiny_tokenizer();
  const std::string text = "alpha beta gamma delta";
  const std::vector<int32_t> ids = tok->encode(text);
  {
    TextStream s(*tok, {});
    EXPECT_EQ(stream_all(s, ids), text);
    EXPECT_FALSE(s.stopped());
  }
  for (const std::string stop : {"a g", "ta", "delta", "mma d", "zz", "alpha beta gamma delta!"}) {
    TextStream s(*tok, {stop, "never"});
    const std::string got = stream_all(s, ids);
    const size_t at = text.find(stop);
    EXPECT_EQ(got, at == std::string::npos ? text : text.substr(0, at)) << stop;
    EXPECT_EQ(s.stopped(), at != std::string::npos) << stop;
  }
  // A prefix of a stop string is held only while it can still match.
  TextStream s(*tok, {"beta gamma X"});
  std::string streamed;
  for (int32_t id : ids) streamed += s.push(id);
  EXPECT_EQ(streamed + s.finish(), text);
  // BOS and EOS are not text.
  TextStream t(*tok, {});
  EXPECT_EQ(t.push(*tok->bos_id()) + t.push(ids[0]) + t.push(*tok->eos_id()) + t.finish(),
            tok->decode(std::vector<int32_t>{ids[0]}));
}

// Runs generated text through a job: tokens pushed into the channel as the engine thread would.
struct JobRun {
  std::vector<json> deltas;
  json whole;
  std::string finish_reason;
};
JobRun run_job(const std::string& generated, bool parallel, IdSource& ids) {
  Metrics metrics;
  EngineLoop loop(metrics, 0);  // never started: cancellations just queue
  const auto tok = tiny_tokenizer();
  ChatRequest request;
  request.parallel_tool_calls = parallel;
  ChatPrompt prompt;
  prompt.tools = true;
  auto channel = std::make_shared<RequestChannel>();
  GenerationJob job(loop, channel, make_chat_shaper(request, prompt, ids), *tok,
                    GenerationRequest{}, 10);
  std::vector<int32_t> tokens = tok->encode(generated);
  tokens.push_back(*tok->eos_id());
  JobRun run;
  for (int32_t t : tokens) {
    channel->push(t);
    job.advance(run.deltas, std::chrono::milliseconds(1));
  }
  channel->close({FinishReason::kStop, 10, int(tokens.size()), std::nullopt});
  while (!job.advance(run.deltas, std::chrono::milliseconds(1))) {
  }
  run.whole = job.shaper().whole().second;
  run.finish_reason = job.finish_reason();
  EXPECT_EQ(job.completion_tokens(), int(tokens.size()));
  return run;
}

std::string tool_block(const std::vector<text::ChatToolCall>& calls) {
  return text::render_tool_calls(calls, text::ChatFormat::kV32, 0);
}

TEST(ChatOutput, ToolCallsStreamedEqualTheWholeMessage) {
  const std::string generated =
      "Let me look." + tool_block({{"x", "read_file", R"({"path": "src/a b.txt"})"},
                                   {"y", "run_shell", R"({"command": "ls -l | wc"})"}});
  IdSource ids;
  const JobRun run = run_job(generated, true, ids);
  EXPECT_EQ(run.finish_reason, "tool_calls");
  const json& m = run.whole;
  EXPECT_EQ(m["content"], "Let me look.");
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "read_file");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"path", "src/a b.txt"}}));
  EXPECT_EQ(json::parse(m["tool_calls"][1]["function"]["arguments"].get<std::string>()),
            json({{"command", "ls -l | wc"}}));
  EXPECT_NE(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);
  EXPECT_EQ(m[std::string(text::kRawCompletionKey)], generated);
  // The deltas rebuild the same message: content, then each call's id and name, then arguments.
  std::string content;
  std::map<int, json> calls;
  for (const json& d : run.deltas) {
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!d.contains("tool_calls")) continue;
    for (const json& c : d["tool_calls"]) {
      json& call = calls[c["index"].get<int>()];
      if (c.contains("id")) call["id"] = c["id"];
      if (c.contains("function") && c["function"].contains("name")) {
        call["name"] = c["function"]["name"];
      }
      if (c.contains("function") && c["function"].contains("arguments")) {
        call["arguments"] =
            call.value("arguments", "") + c["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(content, "Let me look.");
  ASSERT_EQ(calls.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(calls[i]["id"], m["tool_calls"][size_t(i)]["id"]);
    EXPECT_EQ(calls[i]["name"], m["tool_calls"][size_t(i)]["function"]["name"]);
    EXPECT_EQ(calls[i]["arguments"], m["tool_calls"][size_t(i)]["function"]["arguments"]);
  }
}

TEST(ChatOutput, ParallelToolCallsFalseKeepsTheFirstCall) {
  IdSource ids;
  const JobRun run = run_job(
      tool_block({{"x", "read_file", R"({"path": "a"})"}, {"y", "read_file", R"({"path": "b"})"}}),
      false, ids);
  ASSERT_EQ(run.whole["tool_calls"].size(), 1u);
  EXPECT_EQ(run.whole["tool_calls"][0]["function"]["arguments"], R"({"path": "a"})");
  for (const json& d : run.deltas) {
    if (d.contains("tool_calls")) {
      EXPECT_EQ(d["tool_calls"][0]["index"], 0);
    }
  }
}

TEST(ChatOutput, PlainTextIsContentAndToolCallIdsAreUniqueAcrossRequests) {
  IdSource ids;  // one per server process
  const JobRun plain = run_job("just words", true, ids);
  EXPECT_EQ(plain.finish_reason, "stop");
  EXPECT_EQ(plain.whole["content"], "just words");
  EXPECT_FALSE(plain.whole.contains("tool_calls"));
  std::set<std::string> seen;
  for (int i = 0; i < 5; ++i) {
    const JobRun r = run_job(tool_block({{"x", "read_file", R"({"path": "a"})"}}), true, ids);
    seen.insert(r.whole["tool_calls"][0]["id"].get<std::string>());
  }
  EXPECT_EQ(seen.size(), 5u) << "tool-call ids repeat across requests";
}

TEST(Ids, UniqueAcrossThreads) {
  IdSource ids;
  std::vector<std::vector<std::string>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) got[size_t(t)].push_back(ids.next("chatcmpl-"));
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> all;
  for (auto& v : got) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), 4000u);
}

}  // namespace
}  // namespace dsa::server::testing

namespace dsa::server::testing {
namespace {

// The engine thread appends without waking and hands the channels to a Waker: every waiting
// reader is still woken (it would otherwise sleep for its whole one-hour timeout), and a token
// appended before the reader waits is never lost.
TEST(Waker, WakesEveryReaderOfAStep) {
  constexpr int kReaders = 16;
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < kReaders; ++i) channels.push_back(std::make_shared<RequestChannel>());
  std::vector<std::vector<int32_t>> got(kReaders);
  std::atomic<int> waiting{0}, done{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back([&, i] {
      ++waiting;
      while (got[size_t(i)].size() < 2)
        channels[size_t(i)]->wait(got[size_t(i)], std::chrono::hours(1));
      ++done;
    });
  }
  Waker waker;
  ASSERT_TRUE(eventually([&] { return waiting.load() == kReaders; }));
  for (int32_t step = 0; step < 2; ++step) {
    std::vector<std::shared_ptr<RequestChannel>> batch;
    for (int i = 0; i < kReaders; ++i) {
      channels[size_t(i)]->append(100 * i + step);
      batch.push_back(channels[size_t(i)]);
    }
    waker.post(batch);
    EXPECT_TRUE(batch.empty()) << "post takes the batch";
  }
  const bool all_woken = eventually([&] { return done.load() == kReaders; }, 30);
  if (!all_woken) {  // unblock the readers before failing, so the test ends
    for (auto& c : channels) c->close(ChannelFinal{});
  }
  for (std::thread& t : readers) t.join();
  ASSERT_TRUE(all_woken) << done.load() << " of " << kReaders << " readers woken";
  for (int i = 0; i < kReaders; ++i)
    EXPECT_EQ(got[size_t(i)], (std::vector<int32_t>{100 * i, 100 * i + 1}));
}

}  // namespace
}  // namespace dsa::server::testing
