// Paged caches: the page allocator, per-request page tables, and the per-layer pools (DESIGN §2).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dsa/backend.h"
#include "dsa/slot.h"

namespace dsa {

// Hands out page ids in [1, total_pages); page 0 is reserved and never handed out.
// Invariant, at all times: free_pages() + used_pages() == total_pages() - 1.
class PageAllocator {
 public:
  explicit PageAllocator(int64_t total_pages);  // total_pages >= 2, else kInvalidArgument

  std::optional<int32_t> allocate();  // nullopt when exhausted: an error for the caller, never UB
  // Takes n pages or none: on exhaustion nothing is taken and false is returned.
  bool allocate_n(int64_t n, std::vector<int32_t>& out);
  void release(int32_t page);  // kInvalidArgument on page 0, out of range, or a double free

  int64_t total_pages() const { return total_; }
  int64_t free_pages() const { return int64_t(free_list_.size()); }
  int64_t used_pages() const { return used_; }

 private:
  int64_t total_;
  int64_t used_ = 0;
  std::vector<int32_t> free_list_;  // a stack: the lowest ids are handed out first
  std::vector<uint8_t> in_use_;     // [total_]
};

// The pages of one request, in token order. Token t lives at slot pages[t / 64] * 64 + t % 64.
class PageTable {
 public:
  // Grows to hold n_tokens, taking pages from the allocator. All-or-nothing: on exhaustion it
  // takes nothing and returns false.
  bool reserve(int64_t n_tokens, PageAllocator& allocator);
  void release_all(PageAllocator& allocator);  // returns every page; the table becomes empty

  int64_t slot(int64_t position) const;  // kOutOfRange past the reserved tokens
  int64_t capacity_tokens() const { return int64_t(pages_.size()) * kPageSize; }
  const std::vector<int32_t>& pages() const { return pages_; }

 private:
  std::vector<int32_t> pages_;
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
