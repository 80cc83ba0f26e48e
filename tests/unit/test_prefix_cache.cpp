// The prefix cache on its own (no model): matching whole pages of the same prefix, swapping
// duplicates, least-recently-used eviction of unreferenced pages, poisoning, the host-side store
// check, tails (a finished request's partly filled last page, handed to the one request that
// continues it), and exact accounting under a long random workload.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/test_util.h"
#include "dsa/error.h"
#include "dsa/prefix_cache.h"

namespace dsa {
namespace {

using testing::Rng;

std::vector<int32_t> tokens_of(Rng& rng, int n) {
  std::vector<int32_t> t(size_t(n), 0);
  for (auto& x : t) x = int32_t(rng.integer(0, 1000));
  return t;
}

// A table that "writes" tokens[0, n): reserves its pages, then shares every full one.
PageTable write_and_share(PrefixCache& cache, PageAllocator& a, std::span<const int32_t> tokens) {
  PageTable t;
  const int64_t max_pages = int64_t(tokens.size()) / kPageSize;
  cache.share(cache.match(tokens, max_pages), t);
  EXPECT_TRUE(t.reserve(int64_t(tokens.size()), a));
  while (t.shared_pages() < max_pages) {
    EXPECT_NE(cache.insert_next(tokens, t).outcome, PrefixCache::Insert::kRefused);
  }
  return t;
}

void expect_identity(const PageAllocator& a) {
  EXPECT_EQ(a.free_pages() + a.used_pages() + a.cached_pages(), a.total_pages() - 1);
}

TEST(PrefixCache, MatchesOnlyWholePagesOfTheSamePrefix) {
  PageAllocator a(32);
  PrefixCache cache(a);
  Rng rng(1);
  const auto tokens = tokens_of(rng, 3 * kPageSize + 10);
  PageTable t = write_and_share(cache, a, tokens);
  EXPECT_EQ(t.shared_pages(), 3);
  EXPECT_EQ(a.cached_pages(), 3);
  EXPECT_EQ(a.used_pages(), 1);  // the partly filled fourth page stays owned
  expect_identity(a);
  EXPECT_EQ(cache.match(tokens, 10),
            std::vector<int32_t>(t.pages().begin(), t.pages().begin() + 3));
  EXPECT_EQ(cache.match(tokens, 2).size(), 2u);
  EXPECT_TRUE(cache.match(std::span(tokens).first(kPageSize - 1), 10).empty());
  auto changed = tokens;
  changed[kPageSize + 7] ^= 1;  // page 1 differs: only page 0 matches
  EXPECT_EQ(cache.match(changed, 10).size(), 1u);
  changed = tokens;
  changed[3] ^= 1;  // page 0 differs: pages 1 and 2 hold the same tokens but another prefix
  EXPECT_TRUE(cache.match(changed, 10).empty());
  EXPECT_EQ(cache.refcount(t.pages()[0]), 1);
  cache.release(t);
  EXPECT_EQ(a.used_pages(), 0);
  EXPECT_EQ(a.cached_pages(), 3);
  EXPECT_EQ(cache.evictable_pages(), 3);
  cache.check_invariants();
}

TEST(PrefixCache, ADuplicatePageIsSwappedForTheCachedOneAndFreed) {
  PageAllocator a(32);
  PrefixCache cache(a);
  Rng rng(2);
  const auto tokens = tokens_of(rng, 2 * kPageSize);
  PageTable first, second;
  ASSERT_TRUE(first.reserve(2 * kPageSize, a));
  ASSERT_TRUE(second.reserve(2 * kPageSize, a));  // both wrote the same prefix at once
  EXPECT_EQ(cache.insert_next(tokens, first).outcome, PrefixCache::Insert::kInserted);
  const int32_t own = second.pages()[0];
  const PrefixCache::InsertResult r = cache.insert_next(tokens, second);
  EXPECT_EQ(r.outcome, PrefixCache::Insert::kSwapped);
  EXPECT_EQ(r.page, first.pages()[0]);
  EXPECT_EQ(r.freed, own);
  EXPECT_EQ(a.state(own), PageState::kFree);
  EXPECT_EQ(second.pages()[0], first.pages()[0]);
  EXPECT_EQ(cache.refcount(first.pages()[0]), 2);
  // Page 1 of the second table now hangs under the shared page 0.
  EXPECT_EQ(cache.insert_next(tokens, second).outcome, PrefixCache::Insert::kInserted);
  EXPECT_EQ(cache.insert_next(tokens, first).outcome, PrefixCache::Insert::kSwapped);
  EXPECT_EQ(first.pages(), second.pages());
  expect_identity(a);
  cache.check_invariants();
  cache.release(first);
  cache.release(second);
  EXPECT_EQ(a.cached_pages(), 2);
  EXPECT_EQ(a.used_pages(), 0);
}

TEST(PrefixCache, EvictionTakesTheLeastRecentlyUsedUnreferencedPagesLeavesFirst) {
  PageAllocator a(16);
  PrefixCache cache(a);
  Rng rng(3);
  const auto old_tokens = tokens_of(rng, 3 * kPageSize);
  const auto new_tokens = tokens_of(rng, 2 * kPageSize);
  PageTable old_t = write_and_share(cache, a, old_tokens);
  PageTable new_t = write_and_share(cache, a, new_tokens);
  const std::vector<int32_t> old_pages = old_t.pages();
  cache.release(old_t);
  EXPECT_EQ(cache.evictable_pages(), 3);
  std::vector<int32_t> freed;
  EXPECT_EQ(cache.evict(100, freed), 3);  // the referenced pages of new_t stay
  EXPECT_EQ(freed, std::vector<int32_t>(old_pages.rbegin(), old_pages.rend()));  // leaf first
  EXPECT_EQ(a.cached_pages(), 2);
  EXPECT_TRUE(cache.match(old_tokens, 3).empty());
  EXPECT_EQ(cache.match(new_tokens, 2).size(), 2u);
  // Recency: the chain used last is evicted last.
  const auto third = tokens_of(rng, kPageSize);
  PageTable third_t = write_and_share(cache, a, third);
  cache.release(new_t);
  cache.release(third_t);
  freed.clear();
  EXPECT_EQ(cache.evict(1, freed), 1);
  EXPECT_EQ(cache.match(new_tokens, 2).size(), 1u);  // new_t's leaf went first
  EXPECT_EQ(cache.match(third, 1).size(), 1u);
  expect_identity(a);
  cache.check_invariants();
}

TEST(PrefixCache, APoisonedPageIsNeverMatchedAgainAndIsEvictedFirst) {
  PageAllocator a(16);
  PrefixCache cache(a);
  Rng rng(4);
  const auto tokens = tokens_of(rng, 2 * kPageSize);
  const auto other = tokens_of(rng, kPageSize);
  PageTable other_t = write_and_share(cache, a, other);
  cache.release(other_t);
  PageTable t = write_and_share(cache, a, tokens);
  cache.poison(t.pages()[0]);
  EXPECT_TRUE(cache.match(tokens, 2).empty());  // neither it nor its child
  // The table holding it keeps reading it until it lets go, but nothing new hangs under it.
  EXPECT_EQ(cache.refcount(t.pages()[0]), 1);
  cache.release(t);
  std::vector<int32_t> freed;
  EXPECT_EQ(cache.evict(1, freed), 2);  // the poisoned page, with its subtree, before `other`
  EXPECT_EQ(cache.match(other, 1).size(), 1u);
  // The same tokens written again make a fresh, matchable chain.
  PageTable again = write_and_share(cache, a, tokens);
  EXPECT_EQ(cache.match(tokens, 2).size(), 2u);
  cache.release(again);
  expect_identity(a);
  cache.check_invariants();
}

TEST(PrefixCache, StoreCheckRefusesCachedFreeAndReservedPages) {
  PageAllocator a(8);
  PrefixCache cache(a);
  Rng rng(5);
  const auto tokens = tokens_of(rng, kPageSize + 5);
  PageTable t = write_and_share(cache, a, tokens);
  const int64_t cached_slot = t.slot(3), owned_slot = t.slot(kPageSize + 2);
  std::vector<int64_t> slots = {owned_slot, kPadSlot, owned_slot + 1};
  EXPECT_EQ(first_unwritable_slot(a, slots), -1);
  slots.push_back(cached_slot);
  EXPECT_EQ(first_unwritable_slot(a, slots), 3);
  EXPECT_EQ(first_unwritable_slot(a, std::vector<int64_t>{int64_t(7) * kPageSize}), 0);  // free
  EXPECT_EQ(first_unwritable_slot(a, std::vector<int64_t>{5}), 0);                       // page 0
  EXPECT_EQ(first_unwritable_slot(a, std::vector<int64_t>{owned_slot, -7}), 1);  // not the pad
  EXPECT_EQ(first_unwritable_slot(a, std::vector<int64_t>{int64_t(8) * kPageSize}), 0);  // range
  // The allocator refuses to free a cached page as if it were owned, and vice versa.
  EXPECT_THROW(a.release(t.pages()[0]), Error);
  EXPECT_THROW(a.release_cached(t.pages()[1]), Error);
  EXPECT_THROW(t.release_all(a), Error);  // shared pages go back through the cache
  cache.release(t);
}

TEST(PrefixCache, ATailIsKeptAndTakenByTheOneRequestThatContinuesIt) {
  PageAllocator a(32);
  PrefixCache cache(a);
  Rng rng(7);
  const auto tokens = tokens_of(rng, 2 * kPageSize + 20);
  PageTable t = write_and_share(cache, a, tokens);
  const int32_t tail = t.pages()[2];
  EXPECT_EQ(PrefixCache::tail_page(int64_t(tokens.size()), t), tail);
  EXPECT_EQ(PrefixCache::tail_page(2 * kPageSize, t), 0);  // nothing written past the full pages
  std::vector<int32_t> freed;
  // The last 8 tokens were generated: the tail holds 12 prompt tokens, then 8 of the reply.
  EXPECT_EQ(cache.keep_tail(tokens, int64_t(tokens.size()) - 8, int64_t(tokens.size()), t, freed),
            tail);
  EXPECT_TRUE(freed.empty());
  EXPECT_EQ(a.state(tail), PageState::kCached);
  EXPECT_EQ(t.pages().size(), 2u);
  EXPECT_EQ(cache.refcount(tail), 0);
  EXPECT_TRUE(cache.contains(tail));
  cache.release(t);
  EXPECT_EQ(a.used_pages(), 0);
  EXPECT_EQ(a.cached_pages(), 3);
  expect_identity(a);
  cache.check_invariants();

  // The next turn resends the history and adds 30 tokens.
  auto next = tokens;
  const auto more = tokens_of(rng, 30);
  next.insert(next.end(), more.begin(), more.end());
  const auto pages = cache.match(next, (int64_t(next.size()) - 1) / kPageSize);
  ASSERT_EQ(pages.size(), 2u);
  PrefixCache::TailMatch m = cache.match_tail(next, pages, int64_t(next.size()) - 1 - 128);
  EXPECT_EQ(m.page, tail);
  EXPECT_EQ(m.tokens, 20);
  EXPECT_EQ(cache.match_tail(next, pages, 15).tokens, 15);  // at most what the request may skip
  EXPECT_EQ(cache.match_tail(next, pages, 11).page, 0);     // less than the tail's prompt part
  EXPECT_EQ(cache.match_tail(next, std::span(pages).first(1), 100).page, 0);  // another parent
  auto forked = next;
  forked[2 * kPageSize + 5] ^= 1;  // another conversation sharing 5 of the 12 prompt tokens
  EXPECT_EQ(cache.match_tail(forked, pages, 100).page, 0);
  forked = next;
  forked[2 * kPageSize + 15] ^= 1;  // the same prompt, a reply re-encoded differently
  EXPECT_EQ(cache.match_tail(forked, pages, 100).tokens, 15);
  forked = next;
  forked[2 * kPageSize + 20] ^= 1;  // differs only after the tail
  EXPECT_EQ(cache.match_tail(forked, pages, 100).tokens, 20);

  PageTable u;
  EXPECT_THROW(cache.take_tail(tail, u), Error);  // the table does not end with the tail's parent
  cache.share(pages, u);
  cache.take_tail(tail, u);
  EXPECT_EQ(u.pages().back(), tail);
  EXPECT_EQ(u.shared_pages(), 2);
  EXPECT_EQ(a.state(tail), PageState::kOwned);
  EXPECT_EQ(cache.tails(), 0);
  EXPECT_EQ(cache.match_tail(next, pages, 100).page, 0);  // one taker only
  EXPECT_THROW(cache.take_tail(tail, u), Error);
  expect_identity(a);
  cache.check_invariants();
  // The taker fills the page; it joins the cache as a full page like any other.
  ASSERT_TRUE(u.reserve(3 * kPageSize, a));
  auto filled = next;
  filled.resize(3 * kPageSize, 5);
  EXPECT_EQ(cache.insert_next(filled, u).outcome, PrefixCache::Insert::kInserted);
  EXPECT_EQ(cache.refcount(tail), 1);
  cache.release(u);
  cache.check_invariants();
}

TEST(PrefixCache, TailsAreEvictedFirstWithTheirParentAndWhenPoisoned) {
  PageAllocator a(64);
  PrefixCache cache(a);
  Rng rng(8);
  const auto base = tokens_of(rng, kPageSize);
  std::vector<int32_t> kept;
  std::vector<int32_t> freed;
  // Ten requests end 1..10 tokens into page 1 under the same page 0: the first two are dropped
  // (at most kTailsPerParent under one parent).
  for (int i = 0; i < 10; ++i) {
    auto tokens = base;
    const auto tail = tokens_of(rng, 1 + i);
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    PageTable t = write_and_share(cache, a, tokens);
    kept.push_back(
        cache.keep_tail(tokens, int64_t(tokens.size()), int64_t(tokens.size()), t, freed));
    EXPECT_NE(kept.back(), 0);
    cache.release(t);
    cache.check_invariants();
  }
  EXPECT_EQ(freed, std::vector<int32_t>(kept.begin(), kept.begin() + 2));
  EXPECT_EQ(cache.tails(), int64_t(PrefixCache::kTailsPerParent));
  expect_identity(a);
  // A root tail: a request shorter than a page.
  const auto short_prompt = tokens_of(rng, 10);
  PageTable s;
  ASSERT_TRUE(s.reserve(10, a));
  const int32_t root_tail = cache.keep_tail(short_prompt, 10, 10, s, freed);
  EXPECT_NE(root_tail, 0);
  EXPECT_EQ(cache.match_tail(short_prompt, {}, 9).page, 0);  // its last token is not skipped
  auto longer = short_prompt;
  longer.push_back(3);
  EXPECT_EQ(cache.match_tail(longer, {}, 10).page, root_tail);
  // A poisoned tail is never matched and goes first.
  cache.poison(root_tail);
  EXPECT_EQ(cache.match_tail(longer, {}, 10).page, 0);
  cache.check_invariants();
  freed.clear();
  EXPECT_EQ(cache.evict(1, freed), 1);
  EXPECT_EQ(freed, std::vector<int32_t>{root_tail});
  // Tails are older than their parent (kept before it was released): the oldest goes first.
  freed.clear();
  cache.evict(1, freed);
  EXPECT_EQ(freed, std::vector<int32_t>{kept[2]});
  cache.check_invariants();
  // A poisoned parent goes first, and takes every tail under it.
  const int32_t parent = cache.match(base, 1).at(0);
  cache.poison(parent);
  freed.clear();
  cache.evict(1, freed);
  EXPECT_EQ(freed.size(), PrefixCache::kTailsPerParent);  // the parent and its 7 tails
  EXPECT_EQ(freed.back(), parent);
  EXPECT_EQ(cache.tails(), 0);
  EXPECT_EQ(a.cached_pages(), 0);
  expect_identity(a);
  cache.check_invariants();
}

// A long random workload against a small pool: tables look up, write, share and release random
// prefixes of a few base sequences, and keep and take tails (a later request continuing an ended
// one); eviction makes room. The identity and the cache's invariants hold after every operation,
// and at the end every page is free.
TEST(PrefixCache, RandomWorkloadKeepsExactAccounting) {
  constexpr int64_t kPages = 48;
  PageAllocator a(kPages);
  PrefixCache cache(a);
  Rng rng(6);
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 4; ++i) bases.push_back(tokens_of(rng, 6 * kPageSize));
  std::vector<std::pair<PageTable, std::vector<int32_t>>> live;
  int64_t hits = 0, swaps = 0, evicted = 0, tails_kept = 0, tails_taken = 0;
  std::vector<std::vector<int32_t>> ended;  // recent requests' tokens: later turns continue them
  for (int op = 0; op < 20000; ++op) {
    if (!live.empty() && (rng.integer(0, 2) == 0 || live.size() > 12)) {
      const size_t i = size_t(rng.integer(0, int64_t(live.size()) - 1));
      auto& [table, written] = live[i];
      if (rng.integer(0, 1) == 0) {
        std::vector<int32_t> freed;
        const int64_t n = int64_t(written.size());
        tails_kept += cache.keep_tail(written, n - rng.integer(0, 8), n, table, freed) != 0;
        evicted += int64_t(freed.size());
        ended.push_back(written);
        if (ended.size() > 8) ended.erase(ended.begin());
      }
      cache.release(table);
      live.erase(live.begin() + long(i));
    } else {
      // A base's prefix with a random tail: pages shared where the prefix matches.
      const auto& base = bases[size_t(rng.integer(0, 3))];
      std::vector<int32_t> tokens(base.begin(),
                                  base.begin() + rng.integer(1, int64_t(base.size())));
      const auto tail = tokens_of(rng, int(rng.integer(0, 80)));
      tokens.insert(tokens.end(), tail.begin(), tail.end());
      if (!ended.empty() && rng.integer(0, 2) == 0) {  // the next turn of an ended request
        tokens = ended[size_t(rng.integer(0, int64_t(ended.size()) - 1))];
        const auto more = tokens_of(rng, int(rng.integer(1, 40)));
        tokens.insert(tokens.end(), more.begin(), more.end());
      }
      PageTable t;
      // One in four was admitted before the others' pages were cached: it writes them again.
      const int64_t lookup = rng.integer(0, 3) == 0 ? 0 : (int64_t(tokens.size()) - 1) / kPageSize;
      const auto pages = cache.match(tokens, lookup);
      hits += int64_t(pages.size());
      cache.share(pages, t);
      const PrefixCache::TailMatch m = cache.match_tail(
          tokens, pages, int64_t(tokens.size()) - 1 - int64_t(pages.size()) * kPageSize);
      if (m.page && lookup > 0) {
        cache.take_tail(m.page, t);
        ++tails_taken;
      }
      std::vector<int32_t> freed;
      bool ok = true;
      while (!t.reserve(int64_t(tokens.size()), a)) {
        if (cache.evict(1, freed) == 0) {
          ok = false;
          break;
        }
      }
      evicted += int64_t(freed.size());
      if (!ok) {
        cache.release(t);
        continue;
      }
      while (t.shared_pages() < int64_t(tokens.size()) / kPageSize) {
        swaps += cache.insert_next(tokens, t).outcome == PrefixCache::Insert::kSwapped;
      }
      if (rng.integer(0, 50) == 0) cache.poison(t.pages()[0]);
      if (rng.integer(0, 50) == 0 && m.page) {  // a tail not taken, poisoned
        const auto other = cache.match_tail(tokens, pages, kPageSize);
        if (other.page) cache.poison(other.page);
      }
      live.emplace_back(std::move(t), std::move(tokens));
    }
    ASSERT_EQ(a.free_pages() + a.used_pages() + a.cached_pages(), kPages - 1) << "op " << op;
    if (op % 97 == 0) cache.check_invariants();
  }
  cache.check_invariants();
  EXPECT_GT(hits, 1000);
  EXPECT_GT(swaps, 0);
  EXPECT_GT(evicted, 1000);
  EXPECT_GT(tails_kept, 1000);
  EXPECT_GT(tails_taken, 100);
  for (auto& [t, tokens] : live) cache.release(t);
  std::vector<int32_t> freed;
  cache.evict(kPages, freed);
  EXPECT_EQ(a.free_pages(), kPages - 1);
  EXPECT_EQ(a.cached_pages(), 0);
  EXPECT_EQ(cache.references(), 0);
}

}  // namespace
}  // namespace dsa
