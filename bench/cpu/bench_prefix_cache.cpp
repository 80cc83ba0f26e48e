// The prefix cache's host-side cost per request with 100K pages cached (781 chains of 128 full
// pages, 6.4M tokens): the lookup of an L-page cached prefix (match, then taking a reference on
// each page), one new page written after it and inserted, and the release of the request. Each
// iteration then removes the page it inserted (poison + evict, timed too), so the cache stays at
// the same 100K pages. Items are pages: the cost is flat per page, O(prefix / 64) per request.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "dsa/prefix_cache.h"

namespace dsa {
namespace {

constexpr int kChainPages = 128;
constexpr int kChains = 781;  // 99,968 cached pages

std::vector<int32_t> random_tokens(std::mt19937_64& gen, size_t n) {
  std::uniform_int_distribution<int32_t> dist(0, 129279);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = dist(gen);
  return t;
}

struct Filled {
  Filled() : allocator(int64_t(kChains) * kChainPages + 1024), cache(allocator) {
    std::mt19937_64 gen(7);
    for (int c = 0; c < kChains; ++c) {
      chains.push_back(random_tokens(gen, size_t(kChainPages + 1) * kPageSize));
      PageTable t;
      t.reserve(int64_t(kChainPages) * kPageSize, allocator);
      while (t.shared_pages() < kChainPages) cache.insert_next(chains.back(), t);
      cache.release(t);
    }
  }
  PageAllocator allocator;
  PrefixCache cache;
  std::vector<std::vector<int32_t>> chains;  // each: 128 cached pages, then one page never cached
};

Filled& filled() {
  static auto* f = new Filled();  // built once for every run of the benchmark
  return *f;
}

// Arg: L, the cached prefix in pages. The request's tokens: a chain's first L pages, then a page
// of tokens not in the cache (which it writes and inserts).
void BM_PrefixCacheRequest(benchmark::State& state) {
  Filled& f = filled();
  const int64_t pages = state.range(0);
  std::vector<std::vector<int32_t>> requests;
  for (const auto& chain : f.chains) {
    std::vector<int32_t> tokens(chain.begin(), chain.begin() + pages * kPageSize);
    tokens.insert(tokens.end(), chain.end() - kPageSize, chain.end());
    requests.push_back(std::move(tokens));
  }
  std::mt19937_64 gen(11);
  int64_t hit_pages = 0;
  std::vector<int32_t> freed;
  for (auto _ : state) {
    const auto& tokens = requests[size_t(gen() % kChains)];
    PageTable t;
    const std::vector<int32_t> hit = f.cache.match(tokens, pages);
    f.cache.share(hit, t);
    t.reserve(int64_t(tokens.size()), f.allocator);
    const PrefixCache::InsertResult ins = f.cache.insert_next(tokens, t);
    f.cache.release(t);
    hit_pages += int64_t(hit.size());
    f.cache.poison(ins.page);  // back to the same 100K pages
    freed.clear();
    f.cache.evict(1, freed);
  }
  state.SetItemsProcessed(state.iterations() * (pages + 1));
  state.counters["cached_pages"] = double(f.cache.cached_pages());
  state.counters["hit_pages"] = double(hit_pages) / double(state.iterations());
}
BENCHMARK(BM_PrefixCacheRequest)->Arg(8)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace dsa
