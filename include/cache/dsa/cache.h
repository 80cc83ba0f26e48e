// Paged caches: the page allocator, per-request page tables, and the per-layer pools (DESIGN §2).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dsa/backend.h"
#include "dsa/slot.h"

namespace dsa {

// Where a page is: free, owned by exactly one request (the only pages a store may target), or held
// by the prefix cache (read-only, possibly shared by several requests).
enum class PageState : uint8_t { kFree, kOwned, kCached };
const char* page_state_name(PageState s);

// Hands out page ids in [1, total_pages); page 0 is reserved and never handed out.
// Invariant, at all times: free_pages() + used_pages() + cached_pages() == total_pages() - 1.
class PageAllocator {
 public:
  explicit PageAllocator(int64_t total_pages);  // total_pages >= 2, else kInvalidArgument

  std::optional<int32_t> allocate();  // nullopt when exhausted: an error for the caller, never UB
  // Takes n pages or none: on exhaustion nothing is taken and false is returned.
  bool allocate_n(int64_t n, std::vector<int32_t>& out);
  void release(int32_t page);  // kInvalidArgument on page 0, out of range, or not kOwned

  // The prefix cache's transitions: an owned page becomes read-only cache property, a cached page
  // no request references goes back to the free list (eviction), and a cached partial page (a
  // tail, which is never shared) is handed to the one request that continues it. Each throws
  // kInvalidArgument when the page is not in the state it starts from.
  void to_cached(int32_t page);       // kOwned -> kCached
  void release_cached(int32_t page);  // kCached -> kFree
  void to_owned(int32_t page);        // kCached -> kOwned

  PageState state(int32_t page) const;  // kReservedPage and out-of-range ids: kInvalidArgument
  // Whether a store may target the page: in [1, total) and kOwned. Never throws (the host-side
  // store check asks this for every row of every step).
  bool owned(int64_t page) const {
    return page > kReservedPage && page < total_ && state_[size_t(page)] == PageState::kOwned;
  }
  int64_t total_pages() const { return total_; }
  int64_t free_pages() const { return int64_t(free_list_.size()); }
  int64_t used_pages() const { return used_; }  // kOwned
  int64_t cached_pages() const { return cached_; }

 private:
  void check_page(int32_t page, const char* what) const;
  void move(int32_t page, PageState from, PageState to, const char* what);

  int64_t total_;
  int64_t used_ = 0, cached_ = 0;
  std::vector<int32_t> free_list_;  // a stack: the lowest ids are handed out first
  std::vector<PageState> state_;    // [total_]
};

// The pages of one request, in token order. Token t lives at slot pages[t / 64] * 64 + t % 64.
// The first shared_pages() pages are read-only references to prefix-cache pages (DESIGN §8); the
// rest are owned by this table alone, and only those are ever written.
class PageTable {
 public:
  // Grows to hold n_tokens, taking pages from the allocator. All-or-nothing: on exhaustion it
  // takes nothing and returns false.
  bool reserve(int64_t n_tokens, PageAllocator& allocator);
  // Returns every page; the table becomes empty. A table with shared pages is released through
  // PrefixCache::release instead (kInvalidArgument here).
  void release_all(PageAllocator& allocator);

  int64_t slot(int64_t position) const;  // kOutOfRange past the reserved tokens
  int64_t capacity_tokens() const { return int64_t(pages_.size()) * kPageSize; }
  const std::vector<int32_t>& pages() const { return pages_; }
  int64_t shared_pages() const { return shared_; }
  bool empty() const { return pages_.empty(); }

  // The prefix cache's side (PrefixCache calls these; the references are its business):
  void append_shared(int32_t page);  // only while every page so far is shared
  int32_t share_next(int32_t page);  // page shared_pages() becomes `page`; returns the old
  void release_owned(PageAllocator& allocator);  // frees the owned pages, keeps the shared ones
  int32_t take_first_owned();          // removes page shared_pages() from the table and returns it
  void append_owned(int32_t page);     // an owned page the table did not reserve (a handed-on tail)
  std::vector<int32_t> take_shared();  // the shared pages, in order; the table is emptied

 private:
  std::vector<int32_t> pages_;
  int64_t shared_ = 0;
};

struct CacheConfig {
  int num_layers = 1;
  int64_t num_pages = 2;  // per pool, including the reserved page 0
  KvDtype latent_dtype = KvDtype::kBf16;
  KvDtype index_k_dtype = KvDtype::kBf16;
  ScaleRounding fp8_scale_rounding = ScaleRounding::kExact;
};

// The latent-KV and index-K pools of every layer, in one backend's memory, zero-filled at
// creation. One allocator serves them all: a page id means the same tokens in every pool.
class KvCache {
 public:
  KvCache(Backend& backend, const CacheConfig& config);

  const CacheConfig& config() const { return config_; }
  PageAllocator& allocator() { return allocator_; }
  PoolView latent(int layer) const;
  PoolView index_k(int layer) const;
  int64_t capacity_slots() const { return config_.num_pages * kPageSize; }

 private:
  CacheConfig config_;
  PageAllocator allocator_;
  std::vector<DeviceArray<uint8_t>> latent_, index_k_;  // [layers]
};

}  // namespace dsa
