// The engine: continuous batching against single-request greedy generation, batch-composition
// independence, preemption, abort, failures, sessions, sampling and the auditor's reports.
#include <gtest/gtest.h>

#include <map>

#include "common/test_util.h"
#include "dsa/engine.h"
#include "dsa/error.h"
#include "dsa/generate.h"
#include "engine_test_helpers.h"

namespace dsa {
namespace {

using testing::Rng;

using testing::finish_all;
using testing::kContext;
using testing::random_tokens;
using testing::Tiny;

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_new;
};
Workload make_workload(uint64_t seed, int n, int min_prompt, int max_prompt, int min_new,
                       int max_new) {
  Rng rng(seed);
  Workload w;
  for (int i = 0; i < n; ++i) {
    w.prompts.push_back(random_tokens(rng, int(rng.integer(min_prompt, max_prompt))));
    w.max_new.push_back(int(rng.integer(min_new, max_new)));
  }
  return w;
}

class EngineTest : public ::testing::Test {
 protected:
  Tiny& tiny() { return tiny_; }
  std::map<int64_t, RequestOutput> run_workload(const Workload& w, int64_t pages, EngineOptions o,
                                                EngineStats* stats = nullptr);
  Tiny tiny_;
};

EngineOptions eager() { return EngineOptions{}; }
EngineOptions graph(std::vector<int> buckets = {1, 2, 4, 8, 16}) {
  EngineOptions o;
  o.runner.mode = RunMode::kGraph;
  o.runner.buckets = std::move(buckets);
  return o;
}

std::map<int64_t, RequestOutput> EngineTest::run_workload(const Workload& w, int64_t pages,
                                                          EngineOptions o, EngineStats* stats) {
  auto cache = tiny().cache(pages);
  Engine e(*tiny().model, *cache, std::move(o));
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    RequestParams p;
    p.max_new_tokens = w.max_new[i];
    e.submit(w.prompts[i], p);
  }
  auto out = finish_all(e);
  EXPECT_EQ(cache->allocator().free_pages(), pages - 1);
  EXPECT_EQ(cache->allocator().used_pages(), 0);
  if (stats) *stats = e.stats();
  return out;
}

TEST_F(EngineTest, BatchedRequestsMatchSingleRequestGeneration) {
  const Workload w = make_workload(21, 5, 10, 70, 2, 8);
  auto out = run_workload(w, 64, graph());
  ASSERT_EQ(out.size(), w.prompts.size());
  auto cache = tiny().cache(16);
  Runner alone(*tiny().model, *cache, RunnerOptions{});
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    const auto expected = generate_greedy(alone, *cache, *tiny().model, w.prompts[i], w.max_new[i]);
    const RequestOutput& o = out.at(int64_t(i) + 1);
    EXPECT_EQ(o.tokens, expected) << "request " << i;
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.prompt_tokens, int(w.prompts[i].size()));
  }
}

TEST_F(EngineTest, PreemptionUnderATightPoolGivesTheUnlimitedOutputs) {
  // Six requests of 50..62 prompt tokens that grow past one page while decoding; four usable
  // pages cannot hold them all at two pages each.
  const Workload w = make_workload(22, 6, 50, 62, 25, 30);
  EngineStats tight_stats, free_stats;
  auto unlimited = run_workload(w, 64, eager(), &free_stats);
  auto tight = run_workload(w, 5, graph(), &tight_stats);
  EXPECT_EQ(free_stats.preemptions, 0);
  EXPECT_GT(tight_stats.preemptions, 0);
  ASSERT_EQ(tight.size(), w.prompts.size());
  int preempted = 0;
  for (auto& [id, o] : unlimited) {
    EXPECT_EQ(tight.at(id).tokens, o.tokens) << "request " << id;
    EXPECT_EQ(tight.at(id).reason, o.reason);
    preempted += tight.at(id).preemptions > 0;
  }
  EXPECT_GT(preempted, 0);
}

TEST_F(EngineTest, NewTokensStreamEachRequestsOutputInOrderThroughPreemption) {
  // The per-step token list, concatenated per request, is exactly each finished output: nothing
  // repeated by a preemption's recompute, nothing missing, the final token included.
  const Workload w = make_workload(31, 6, 50, 62, 25, 30);
  auto cache = tiny().cache(5);  // tight: requests are preempted and recomputed
  Engine e(*tiny().model, *cache, graph());
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    RequestParams p;
    p.max_new_tokens = w.max_new[i];
    if (i % 2) {
      p.sampling.temperature = 0.9f;
      p.sampling.seed = 7 + i;
    }
    e.submit(w.prompts[i], p);
  }
  std::map<int64_t, std::vector<int32_t>> streamed;
  std::map<int64_t, RequestOutput> finished;
  while (!e.idle()) {
    e.step();
    for (const NewToken& t : e.new_tokens()) {
      EXPECT_EQ(finished.count(t.request), 0u) << "a token after the request finished";
      streamed[t.request].push_back(t.token);
    }
    for (RequestOutput& o : e.take_finished()) finished[o.id] = std::move(o);
  }
  EXPECT_GT(e.stats().preemptions, 0);
  ASSERT_EQ(finished.size(), w.prompts.size());
  for (const auto& [id, o] : finished) EXPECT_EQ(streamed[id], o.tokens) << "request " << id;
  e.step();  // a step with no work clears the list
  EXPECT_TRUE(e.new_tokens().empty());
  int64_t replays = 0;
  for (const auto& [bucket, n] : e.stats().graph_replays) {
    EXPECT_TRUE(bucket == 1 || bucket == 2 || bucket == 4 || bucket == 8 || bucket == 16);
    replays += n;
  }
  EXPECT_EQ(replays, e.stats().decode_steps);
}

TEST_F(EngineTest, OutputsDoNotDependOnBatchComposition) {
  // One session alone in eager mode, then the same session inside a busy graph-mode engine with
  // other sessions and plain requests coming and going: the same tokens, turn by turn.
  Rng rng(23);
  std::vector<std::vector<int32_t>> turns;
  for (int t = 0; t < 3; ++t) turns.push_back(random_tokens(rng, int(rng.integer(20, 50))));
  auto run_session = [&](Engine& e, int64_t s, int turn) {
    RequestParams p;
    p.max_new_tokens = 10;
    return e.submit_turn(s, turns[size_t(turn)], p);
  };

  std::vector<std::vector<int32_t>> alone;
  {
    auto cache = tiny().cache(32);
    Engine e(*tiny().model, *cache, eager());
    const int64_t s = e.open_session(SessionPolicy::kKeepCache);
    for (int t = 0; t < 3; ++t) {
      run_session(e, s, t);
      alone.push_back(finish_all(e).begin()->second.tokens);
    }
  }

  auto cache = tiny().cache(64);
  Engine e(*tiny().model, *cache, graph());
  const int64_t s = e.open_session(SessionPolicy::kKeepCache);
  std::vector<int64_t> others;
  for (int i = 0; i < 4; ++i) others.push_back(e.open_session(SessionPolicy::kRecompute));
  int turn = 0;
  int64_t pending = run_session(e, s, turn);
  std::vector<std::vector<int32_t>> busy;
  for (int step = 0; turn < 3; ++step) {
    // Background work of varying size: new plain requests and turns of other sessions.
    if (step % 3 == 0) {
      RequestParams p;
      p.max_new_tokens = int(rng.integer(1, 12));
      e.submit(random_tokens(rng, int(rng.integer(5, 40))), p);
    }
    for (int64_t o : others) {
      if (e.session(o).active_request < 0 && rng.integer(0, 3) == 0) {
        RequestParams p;
        p.max_new_tokens = int(rng.integer(3, 15));
        e.submit_turn(o, random_tokens(rng, int(rng.integer(4, 30))), p);
      }
    }
    e.step();
    for (RequestOutput& o : e.take_finished()) {
      if (o.id != pending) continue;
      busy.push_back(o.tokens);
      if (++turn < 3) pending = run_session(e, s, turn);
    }
  }
  EXPECT_EQ(busy, alone);
  EXPECT_GT(e.stats().padded_rows, 0);  // the graph really padded along the way
  for (int64_t o : others) e.close_session(o);
  e.close_session(s);
  e.run_until_idle();
  EXPECT_EQ(cache->allocator().used_pages(), 0);
}

TEST_F(EngineTest, AbortMidDecodeFreesEveryPage) {
  auto cache = tiny().cache(32);
  Engine e(*tiny().model, *cache, graph());
  Rng rng(24);
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) {
    RequestParams p;
    p.max_new_tokens = 40;
    ids.push_back(e.submit(random_tokens(rng, 70), p));
  }
  for (int i = 0; i < 25; ++i) e.step();  // all prefilled (16 rows a step), and decoding
  EXPECT_EQ(e.running(), 4u);
  EXPECT_GT(cache->allocator().used_pages(), 4);
  const int64_t used_before = cache->allocator().used_pages();
  EXPECT_TRUE(e.abort(ids[1]));
  EXPECT_FALSE(e.abort(ids[1]));                                // already gone
  EXPECT_EQ(cache->allocator().used_pages(), used_before - 2);  // 70 + a few tokens: 2 pages
  auto out = e.take_finished();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].reason, FinishReason::kAborted);
  EXPECT_GT(out[0].tokens.size(), 0u);
  e.step();
  for (int64_t id : {ids[0], ids[2], ids[3]}) EXPECT_TRUE(e.abort(id));
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(cache->allocator().used_pages(), 0);
  EXPECT_EQ(cache->allocator().free_pages(), cache->allocator().total_pages() - 1);
}

TEST_F(EngineTest, ARequestThatCannotFitFailsClearlyAndOthersComplete) {
  auto cache = tiny().cache(3);  // two usable pages: 128 tokens
  Engine e(*tiny().model, *cache, eager());
  Rng rng(25);
  RequestParams p;
  p.max_new_tokens = 40;
  const int64_t big = e.submit(random_tokens(rng, 100), p);  // 140 tokens: 3 pages
  p.max_new_tokens = 5;
  const int64_t small = e.submit(random_tokens(rng, 30), p);
  p.max_new_tokens = 10;
  const int64_t too_long = e.submit(random_tokens(rng, kContext - 5), p);
  auto out = finish_all(e);
  EXPECT_EQ(out.at(big).reason, FinishReason::kFailed);
  EXPECT_EQ(out.at(big).error, ErrorCode::kResourceExhausted);
  EXPECT_NE(out.at(big).message.find("140 tokens need 3 pages"), std::string::npos)
      << out.at(big).message;
  EXPECT_NE(out.at(big).message.find("only 2 usable pages"), std::string::npos);
  EXPECT_EQ(out.at(too_long).error, ErrorCode::kOutOfRange);
  EXPECT_NE(out.at(too_long).message.find("exceeds the context of 512"), std::string::npos);
  EXPECT_EQ(out.at(small).reason, FinishReason::kLength);
  EXPECT_EQ(out.at(small).tokens.size(), 5u);
  EXPECT_EQ(cache->allocator().used_pages(), 0);
}

TEST_F(EngineTest, BadRequestsAreRejectedAtSubmit) {
  auto cache = tiny().cache(8);
  Engine e(*tiny().model, *cache, eager());
  RequestParams p;
  EXPECT_THROW(e.submit({}, p), Error);
  EXPECT_THROW(e.submit({1, tiny().model->config().vocab_size}, p), Error);  // one past the vocab
  p.max_new_tokens = 0;
  EXPECT_THROW(e.submit({1, 2}, p), Error);
  p.max_new_tokens = 4;
  p.sampling.top_p = 0;
  EXPECT_THROW(e.submit({1, 2}, p), Error);
  EXPECT_TRUE(e.idle());
}

TEST_F(EngineTest, StopTokenEndsTheRequest) {
  Rng rng(26);
  const auto prompt = random_tokens(rng, 30);
  auto cache = tiny().cache(8);
  Engine e(*tiny().model, *cache, eager());
  RequestParams p;
  p.max_new_tokens = 12;
  e.submit(prompt, p);
  const std::vector<int32_t> full = finish_all(e).begin()->second.tokens;
  ASSERT_EQ(full.size(), 12u);
  // Stop at the first occurrence of the fifth token.
  const int32_t stop = full[4];
  const size_t first = size_t(std::find(full.begin(), full.end(), stop) - full.begin());
  p.stop_token = stop;
  e.submit(prompt, p);
  const RequestOutput o = finish_all(e).begin()->second;
  EXPECT_EQ(o.reason, FinishReason::kStop);
  EXPECT_EQ(o.tokens, std::vector<int32_t>(full.begin(), full.begin() + long(first) + 1));
}

TEST_F(EngineTest, SessionsKeepOrRecomputeTheHistoryWithTheSameReplies) {
  Rng rng(27);
  std::vector<std::vector<int32_t>> turns;
  for (int t = 0; t < 3; ++t) turns.push_back(random_tokens(rng, int(rng.integer(10, 40))));
  struct Result {
    std::vector<std::vector<int32_t>> replies;
    std::vector<int32_t> history;
    int64_t prefill_rows = 0;
  };
  auto run = [&](SessionPolicy policy) {
    auto cache = tiny().cache(16);
    Engine e(*tiny().model, *cache, graph());
    const int64_t s = e.open_session(policy);
    Result r;
    for (const auto& t : turns) {
      RequestParams p;
      p.max_new_tokens = 7;
      e.submit_turn(s, t, p);
      EXPECT_THROW(e.submit_turn(s, t, p), Error);  // one turn at a time
      r.replies.push_back(finish_all(e).begin()->second.tokens);
      EXPECT_EQ(cache->allocator().used_pages() > 0, policy == SessionPolicy::kKeepCache);
    }
    r.history = e.session(s).history;
    EXPECT_EQ(e.session(s).turns, 3);
    r.prefill_rows = e.stats().prefill_rows;
    e.close_session(s);
    EXPECT_EQ(cache->allocator().used_pages(), 0);
    return r;
  };
  const Result keep = run(SessionPolicy::kKeepCache);
  const Result recompute = run(SessionPolicy::kRecompute);
  EXPECT_EQ(keep.replies, recompute.replies);
  EXPECT_EQ(keep.history, recompute.history);
  std::vector<int32_t> expected_history;
  int64_t new_rows = 0, full_rows = 0;
  for (size_t t = 0; t < turns.size(); ++t) {
    // Keep prefills the turn's tokens and the previous reply's last token (never fed back);
    // recompute prefills the whole history every turn.
    new_rows += int64_t(turns[t].size()) + (t > 0 ? 1 : 0);
    expected_history.insert(expected_history.end(), turns[t].begin(), turns[t].end());
    full_rows += int64_t(expected_history.size());
    expected_history.insert(expected_history.end(), keep.replies[t].begin(), keep.replies[t].end());
  }
  EXPECT_EQ(keep.history, expected_history);
  EXPECT_EQ(keep.prefill_rows, new_rows);
  EXPECT_EQ(recompute.prefill_rows, full_rows);
}

TEST_F(EngineTest, IdleSessionCachesAreEvictedBeforeAnyoneIsPreempted) {
  auto cache = tiny().cache(5);  // four usable pages
  Engine e(*tiny().model, *cache, eager());
  Rng rng(28);
  const int64_t s = e.open_session(SessionPolicy::kKeepCache);
  RequestParams p;
  p.max_new_tokens = 6;
  e.submit_turn(s, random_tokens(rng, 100), p);  // keeps two pages
  const auto first = finish_all(e).begin()->second.tokens;
  EXPECT_EQ(cache->allocator().used_pages(), 2);
  e.submit(random_tokens(rng, 150), p);  // needs three
  finish_all(e);
  EXPECT_EQ(e.stats().evicted_sessions, 1);
  EXPECT_EQ(e.stats().preemptions, 0);
  // The evicted session recomputes its history on its next turn, with the same result.
  e.submit_turn(s, {1, 2, 3}, p);
  const auto second = finish_all(e).begin()->second;
  EXPECT_EQ(second.prompt_tokens, 100 + 6 + 3);
  EXPECT_EQ(second.reason, FinishReason::kLength);
  e.close_session(s);
  EXPECT_EQ(cache->allocator().used_pages(), 0);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleThroughPreemption) {
  const Workload w = make_workload(29, 6, 50, 62, 25, 30);
  auto run = [&](int64_t pages, uint64_t seed_base, EngineStats* stats) {
    auto cache = tiny().cache(pages);
    Engine e(*tiny().model, *cache, graph());
    for (size_t i = 0; i < w.prompts.size(); ++i) {
      RequestParams p;
      p.max_new_tokens = w.max_new[i];
      p.sampling = {0.9f, 0.9f, seed_base + i};
      e.submit(w.prompts[i], p);
    }
    auto out = finish_all(e);
    *stats = e.stats();
    return out;
  };
  EngineStats free_stats, tight_stats, other_stats;
  auto unlimited = run(64, 100, &free_stats);
  auto tight = run(5, 100, &tight_stats);
  auto other = run(64, 200, &other_stats);
  EXPECT_GT(tight_stats.preemptions, 0);
  int differs = 0;
  for (auto& [id, o] : unlimited) {
    EXPECT_EQ(tight.at(id).tokens, o.tokens) << "request " << id;
    differs += other.at(id).tokens != o.tokens;
  }
  EXPECT_GT(differs, 0);
}

TEST_F(EngineTest, AuditorNamesTheOwnerOfAClobberedSlot) {
  for (AuditScope scope : {AuditScope::kAll, AuditScope::kListed, AuditScope::kSample}) {
    auto cache = tiny().cache(16);
    EngineOptions o = graph();
    o.audit = true;
    o.audit_scope = scope;
    o.audit_sample = 4096;  // more than are watched: the sample is everything
    Engine e(*tiny().model, *cache, o);
    Rng rng(30);
    RequestParams p;
    p.max_new_tokens = 30;
    const int64_t a = e.submit(random_tokens(rng, 40), p);
    for (int i = 0; i < 4; ++i) e.step();
    EXPECT_EQ(e.stats().audit_findings, 0);
    EXPECT_GT(e.auditor()->watched(), 40u);
    // Behind the engine's back: one byte of layer 1's index-K, token 5 of the first page the
    // request was given (page 1: the allocator hands out the lowest ids first).
    const PoolView pool = cache->index_k(1);
    const int64_t offset = (1 * kPageSize + 5) * kIndexHeadDim * 2;
    uint8_t byte = 0;
    tiny().backend->copy_to_host(&byte, pool.data + offset, 1);
    byte ^= 0x40;
    tiny().backend->copy_to_device(pool.data + offset, &byte, 1);
    e.step();
    const int64_t findings = e.stats().audit_findings;
    EXPECT_EQ(findings, 1);
    for (int i = 0; i < 3; ++i) e.step();
    EXPECT_EQ(e.stats().audit_findings, findings);  // reported once
    auto out = finish_all(e);
    const RequestOutput& r = out.at(a);
    EXPECT_TRUE(r.corrupted);
    ASSERT_EQ(r.findings.size(), 1u);
    EXPECT_EQ(r.findings[0].layer, 1);
    EXPECT_EQ(r.findings[0].pool, PoolKind::kIndexK);
    EXPECT_EQ(r.findings[0].slot, kPageSize + 5);
    EXPECT_EQ(r.findings[0].owner, a);
    EXPECT_EQ(e.auditor()->watched(), 0u);  // released slots are forgotten
  }
}

}  // namespace
}  // namespace dsa
