// The engine with the prefix cache (DESIGN §8): the same greedy tokens with the cache on and off,
// eagerly and through graphs; the auditor naming every request that shares a clobbered cached
// page, and catching a changed page (or tail) on reuse; eviction before preemption; and exact
// accounting under a long random workload with aborts, preemptions and eviction.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/test_util.h"
#include "dsa/engine.h"
#include "dsa/error.h"
#include "engine_test_helpers.h"

namespace dsa {
namespace {

using testing::finish_all;
using testing::random_tokens;
using testing::Rng;
using testing::Tiny;

EngineOptions options(bool prefix_cache, RunMode mode, bool audit = false) {
  EngineOptions o;
  o.prefix_cache = prefix_cache;
  o.runner.mode = mode;
  o.runner.buckets = {1, 2, 4, 8, 16};
  o.audit = audit;
  return o;
}

// Flips one byte of layer 1's index-K for `slot`, behind the engine's back.
void clobber_index_k(Tiny& tiny, KvCache& cache, int64_t slot) {
  const PoolView pool = cache.index_k(1);
  const int64_t offset = slot * kIndexHeadDim * 2;
  uint8_t byte = 0;
  tiny.backend->copy_to_host(&byte, pool.data + offset, 1);
  byte ^= 0x40;
  tiny.backend->copy_to_device(pool.data + offset, &byte, 1);
}

class PrefixEngineTest : public ::testing::Test {
 protected:
  Tiny tiny_;
};

// Agent sessions that resend their whole history (kRecompute), one kKeepCache session and plain
// requests, all opening with the same system prompt; turn by turn.
struct AgentRun {
  std::map<std::pair<int, int>, std::vector<int32_t>> replies;  // (session, turn) -> tokens
  std::map<std::pair<int, int>, int> cached_tokens;
  std::map<std::pair<int, int>, int> prompt_tokens;
  EngineStats stats;
};

AgentRun run_agents(Tiny& tiny, const EngineOptions& o) {
  Rng rng(41);
  const auto system = random_tokens(rng, 70);
  auto cache = tiny.cache(40);
  Engine e(*tiny.model, *cache, o);
  std::vector<int64_t> sessions;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(
        e.open_session(i == 0 ? SessionPolicy::kKeepCache : SessionPolicy::kRecompute));
  }
  AgentRun run;
  std::map<int64_t, std::pair<int, int>> by_id;
  for (int turn = 0; turn < 3; ++turn) {
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> message = random_tokens(rng, int(rng.integer(8, 20)));
      if (turn == 0) message.insert(message.begin(), system.begin(), system.end());
      RequestParams p;
      p.max_new_tokens = 4;
      by_id[e.submit_turn(sessions[size_t(i)], message, p)] = {i, turn};
    }
    if (turn == 0) {
      for (int i = 0; i < 2; ++i) {  // plain requests sharing the system prompt
        std::vector<int32_t> prompt = system;
        const auto tail = random_tokens(rng, 10);
        prompt.insert(prompt.end(), tail.begin(), tail.end());
        RequestParams p;
        p.max_new_tokens = 4;
        by_id[e.submit(prompt, p)] = {10 + i, 0};
      }
    }
    while (!e.idle()) {
      e.step();
      e.check_page_accounting();
    }
    for (RequestOutput& out : e.take_finished()) {
      EXPECT_EQ(out.reason, FinishReason::kLength);
      run.replies[by_id.at(out.id)] = out.tokens;
      run.cached_tokens[by_id.at(out.id)] = out.cached_tokens;
      run.prompt_tokens[by_id.at(out.id)] = out.prompt_tokens;
    }
  }
  for (int64_t s : sessions) e.close_session(s);
  EXPECT_EQ(cache->allocator().used_pages(), 0);
  run.stats = e.stats();
  return run;
}

TEST_F(PrefixEngineTest, GreedyOutputsAreIdenticalWithTheCacheOnAndOffEagerAndGraph) {
  const AgentRun off = run_agents(tiny_, options(false, RunMode::kEager));
  ASSERT_EQ(off.replies.size(), 14u);
  EXPECT_EQ(off.stats.prefix_cache_queries, 0);
  for (RunMode mode : {RunMode::kEager, RunMode::kGraph}) {
    const AgentRun on = run_agents(tiny_, options(true, mode));
    EXPECT_EQ(on.replies, off.replies) << (mode == RunMode::kGraph ? "graph" : "eager");
    EXPECT_LT(on.stats.prefill_rows, off.stats.prefill_rows);
    EXPECT_GT(on.stats.prefix_cache_hits, 0);
    EXPECT_LE(on.stats.prefix_cache_hits, on.stats.prefix_cache_queries);
    EXPECT_EQ(on.stats.audit_findings, 0);
    // Every later turn of a resending session finds at least the system prompt's page; the kept
    // session reports its kept history.
    for (int i = 0; i < 4; ++i) {
      for (int turn = 1; turn < 3; ++turn) {
        EXPECT_GE(on.cached_tokens.at({i, turn}), kPageSize) << "session " << i << " turn " << turn;
      }
    }
    EXPECT_GT(on.cached_tokens.at({1, 2}), off.cached_tokens.at({1, 2}));
    // A resending session's next turn continues its last turn's tail too: it finds everything
    // the last turn wrote (its prompt and the first three of its four tokens; the fourth was
    // sampled, never written).
    for (int i = 1; i < 4; ++i) {
      for (int turn = 1; turn < 3; ++turn) {
        EXPECT_EQ(on.cached_tokens.at({i, turn}), on.prompt_tokens.at({i, turn - 1}) + 3)
            << "session " << i << " turn " << turn;
      }
    }
  }
  const AgentRun graph_off = run_agents(tiny_, options(false, RunMode::kGraph));
  EXPECT_EQ(graph_off.replies, off.replies);
}

TEST_F(PrefixEngineTest, AuditorNamesEveryRequestSharingAClobberedCachedPage) {
  auto cache = tiny_.cache(32);
  EngineOptions o = options(true, RunMode::kEager, true);
  o.audit_scope = AuditScope::kListed;
  Engine e(*tiny_.model, *cache, o);
  Rng rng(42);
  const auto prefix = random_tokens(rng, 2 * kPageSize);
  auto with_tail = [&](int n) {
    std::vector<int32_t> p = prefix;
    const auto tail = random_tokens(rng, n);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  RequestParams p;
  p.max_new_tokens = 30;
  const int64_t a = e.submit(with_tail(10), p);
  while (e.stats().decode_steps == 0) e.step();  // a's two full pages are cached
  const int64_t b = e.submit(with_tail(5), p);
  const int64_t c = e.submit(with_tail(7), p);
  for (int i = 0; i < 3; ++i) e.step();
  EXPECT_EQ(e.stats().prefix_cache_hits, 2 * 2 * kPageSize);
  // Page 1 of the prefix: the second page request a was given (the lowest ids go first).
  const int32_t page = 2;
  ASSERT_EQ(e.prefix_cache()->refcount(page), 3);
  clobber_index_k(tiny_, *cache, int64_t(page) * kPageSize + 9);
  e.step();
  EXPECT_EQ(e.stats().audit_findings, 1);
  // A new request with the same prefix reuses page 0 only and recomputes the rest.
  const int64_t d = e.submit(with_tail(3), p);
  auto out = finish_all(e);
  for (int64_t id : {a, b, c}) {
    ASSERT_TRUE(out.at(id).corrupted) << "request " << id;
    ASSERT_EQ(out.at(id).findings.size(), 1u);
    const AuditFinding& f = out.at(id).findings[0];
    EXPECT_EQ(f.owner, kPrefixCacheOwner);
    EXPECT_EQ(f.slot, int64_t(page) * kPageSize + 9);
    EXPECT_EQ(f.sharers, (std::vector<int64_t>{a, b, c}));
    EXPECT_NE(f.describe().find("shared by 3 requests"), std::string::npos) << f.describe();
  }
  EXPECT_FALSE(out.at(d).corrupted);
  EXPECT_EQ(out.at(d).cached_tokens, kPageSize);
  EXPECT_EQ(e.stats().audit_findings, 1);
  e.check_page_accounting();
  EXPECT_EQ(e.prefix_cache()->refcount(page), 0);
}

TEST_F(PrefixEngineTest, AChangedCachedPageIsCaughtOnReuseAndRecomputed) {
  auto cache = tiny_.cache(32);
  Engine e(*tiny_.model, *cache, options(true, RunMode::kEager, true));
  Rng rng(43);
  const auto prompt = random_tokens(rng, 2 * kPageSize + 20);
  RequestParams p;
  p.max_new_tokens = 6;
  e.submit(prompt, p);
  const auto first = finish_all(e).begin()->second;
  EXPECT_EQ(cache->allocator().cached_pages(), 3);  // two full pages and the tail (25 tokens)
  // Nobody holds page 2 (the prompt's second page) now; change it, then ask again.
  clobber_index_k(tiny_, *cache, 2 * kPageSize + 40);
  e.submit(prompt, p);
  const auto second = finish_all(e).begin()->second;
  EXPECT_EQ(e.stats().audit_findings, 1);
  EXPECT_FALSE(second.corrupted);  // caught before anyone read it
  EXPECT_EQ(second.cached_tokens, kPageSize);
  EXPECT_EQ(second.tokens, first.tokens);
  e.check_page_accounting();
  // The recomputed page replaced the poisoned one: a third request finds both pages again (not
  // the second's tail, which holds its reply: a retry of the same prompt does not continue it).
  e.submit(prompt, p);
  const auto third = finish_all(e).begin()->second;
  EXPECT_EQ(third.cached_tokens, 2 * kPageSize);
  EXPECT_EQ(third.tokens, first.tokens);
}

// The next turn of a conversation continues the last turn's tail (its partly filled last page):
// it computes only its new tokens, with the same output as without the cache. A reply that comes
// back re-encoded differently still gives the turn the last prompt's tokens (the taker rewrites
// the rest of the page); a tail changed while it sat in the cache is caught when it is taken, and
// the turn recomputes those tokens.
TEST_F(PrefixEngineTest, TheNextTurnContinuesTheTailAndAChangedTailIsCaught) {
  Rng rng(45);
  const auto prompt = random_tokens(rng, 100);
  const auto message = random_tokens(rng, 5);
  RequestParams p;
  p.max_new_tokens = 6;
  enum Case { kSameReply, kReencodedReply, kClobbered };
  for (Case c : {kSameReply, kReencodedReply, kClobbered}) {
    auto cache = tiny_.cache(32);
    Engine e(*tiny_.model, *cache, options(true, RunMode::kGraph, true));
    e.submit(prompt, p);
    const auto first = finish_all(e).begin()->second;
    const int32_t tail = 2;  // pages 1 and 2 hold the 105 tokens written (the lowest ids first)
    EXPECT_EQ(cache->allocator().state(tail), PageState::kCached);
    if (c == kClobbered) clobber_index_k(tiny_, *cache, tail * kPageSize + 10);
    auto next = prompt;
    next.insert(next.end(), first.tokens.begin(), first.tokens.end());
    if (c == kReencodedReply) next[prompt.size() + 2] = (next[prompt.size() + 2] + 1) % 1000;
    next.insert(next.end(), message.begin(), message.end());
    e.submit(next, p);
    const auto second = finish_all(e).begin()->second;
    e.check_page_accounting();
    EXPECT_FALSE(second.corrupted);
    EXPECT_EQ(e.stats().audit_findings, c == kClobbered ? 1 : 0);
    // 100 + 5 tokens written; the re-encoded reply agrees for 2 tokens after the prompt.
    EXPECT_EQ(second.cached_tokens, c == kSameReply ? 105 : c == kReencodedReply ? 102 : 64);

    auto plain_cache = tiny_.cache(32);
    Engine plain(*tiny_.model, *plain_cache, options(false, RunMode::kEager));
    plain.submit(next, p);
    EXPECT_EQ(second.tokens, finish_all(plain).begin()->second.tokens) << "case " << int(c);
  }
}

TEST_F(PrefixEngineTest, CachedPagesAreEvictedBeforeAnyoneIsPreempted) {
  auto cache = tiny_.cache(9);  // eight usable pages
  Engine e(*tiny_.model, *cache, options(true, RunMode::kGraph));
  Rng rng(44);
  RequestParams p;
  p.max_new_tokens = 4;
  for (int i = 0; i < 6; ++i) {
    e.submit(random_tokens(rng, 2 * kPageSize + 8), p);  // two full pages each stay cached
    finish_all(e);
    e.check_page_accounting();
  }
  EXPECT_GT(e.stats().prefix_cache_evictions, 0);
  EXPECT_EQ(e.stats().preemptions, 0);
  EXPECT_EQ(cache->allocator().used_pages(), 0);
  EXPECT_GT(cache->allocator().cached_pages(), 0);
  EXPECT_EQ(e.stats().cached_pages, cache->allocator().cached_pages());
  EXPECT_EQ(e.drop_cached_pages(), e.stats().cached_pages);
  EXPECT_EQ(cache->allocator().free_pages(), 8);
}

// Thousands of requests sharing random prefixes of a few base sequences, random aborts, and a pool
// small enough that cached pages are evicted and requests preempted all the time. After every
// step the page accounting is exact (free + used + cached = total - 1, every reference counted)
// and the store check held; the auditor verifies every watched slot, cached pages included, after
// every step, so a write into a shared page would be a finding. At the end everything is free.
TEST(PrefixEngine, RandomSharingWithAbortsAndPreemptionKeepsExactAccounting) {
  constexpr int kRequests = 2000;
  Tiny tiny(testing::one_layer_config());
  auto cache = tiny.cache(12);  // eleven usable pages for up to eight running requests
  EngineOptions o = options(true, RunMode::kGraph, true);
  o.audit_scope = AuditScope::kAll;
  o.max_running = 8;
  Engine e(*tiny.model, *cache, o);
  Rng rng(45);
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 3; ++i) bases.push_back(random_tokens(rng, 3 * kPageSize));
  std::set<int64_t> live;
  int submitted = 0, aborted = 0, finished = 0;
  while (submitted < kRequests || !e.idle()) {
    while (submitted < kRequests && live.size() < 10) {
      // A base's first 1..3 pages and one more token. Most reply with a token or two; one in
      // twelve decodes into a page of its own (a page nobody shares, to be evicted later), which
      // under this pool often means preempting someone.
      const auto& base = bases[size_t(rng.integer(0, 2))];
      std::vector<int32_t> prompt(base.begin(), base.begin() + kPageSize * rng.integer(1, 3));
      prompt.push_back(int32_t(rng.integer(0, 255)));
      RequestParams p;
      p.max_new_tokens = rng.integer(0, 11) == 0 ? kPageSize : int(rng.integer(1, 2));
      live.insert(e.submit(prompt, p));
      ++submitted;
    }
    if (!live.empty() && rng.integer(0, 9) == 0) {
      auto it = live.begin();
      std::advance(it, rng.integer(0, int64_t(live.size()) - 1));
      EXPECT_TRUE(e.abort(*it));
      ++aborted;
    }
    e.step();
    e.check_page_accounting();
    for (const RequestOutput& out : e.take_finished()) {
      live.erase(out.id);
      ++finished;
      ASSERT_FALSE(out.corrupted) << "request " << out.id;
      ASSERT_NE(out.reason, FinishReason::kFailed) << out.message;
      EXPECT_LE(out.cached_tokens, out.prompt_tokens - 1);
    }
  }
  EXPECT_EQ(finished, kRequests);
  EXPECT_GT(aborted, 50);
  const EngineStats& s = e.stats();
  EXPECT_EQ(s.audit_findings, 0);
  EXPECT_EQ(s.store_errors, 0);
  EXPECT_GT(s.preemptions, 10);
  EXPECT_GT(s.prefix_cache_evictions, 100);
  EXPECT_GT(s.prefix_cache_hits, s.prefix_cache_queries / 2);
  EXPECT_EQ(cache->allocator().used_pages(), 0);
  e.drop_cached_pages();
  EXPECT_EQ(cache->allocator().free_pages(), cache->allocator().total_pages() - 1);
  EXPECT_EQ(e.auditor()->watched(), 0u);
}

}  // namespace
}  // namespace dsa
