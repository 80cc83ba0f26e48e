// The per-layer latent-KV and index-K pools (DESIGN §2, §3), zero-filled in the backend's memory.
#include <cstdint>
#include <limits>

#include "dsa/cache.h"
#include "dsa/error.h"

namespace dsa {
namespace {

// Checked before any member is built, so a bad config is named as such and not as an allocator
// error.
const CacheConfig& validated(const CacheConfig& config) {
  require(config.num_layers >= 1, ErrorCode::kInvalidArgument,
          "cache config num_layers must be >= 1, got {}", config.num_layers);
  require(config.num_pages >= 2, ErrorCode::kInvalidArgument,
          "cache config num_pages must be >= 2 (page 0 is reserved), got {}", config.num_pages);
  constexpr int64_t kMaxPages = int64_t(std::numeric_limits<int32_t>::max()) + 1;
  require(config.num_pages <= kMaxPages, ErrorCode::kInvalidArgument,
          "cache config num_pages {} exceeds the int32 page-id limit {}", config.num_pages,
          kMaxPages);
  return config;
}

DeviceArray<uint8_t> zeroed_pool(Backend& backend, int64_t num_pages, int64_t page_bytes) {
  const size_t bytes = size_t(num_pages) * size_t(page_bytes);
  DeviceArray<uint8_t> pool(backend, bytes);
  backend.fill(pool.data(), 0, bytes);  // page 0 must read as zeros; the rest starts clean too
  return pool;
}

}  // namespace

KvCache::KvCache(Backend& backend, const CacheConfig& config)
    : config_(validated(config)), allocator_(config_.num_pages) {
  latent_.reserve(size_t(config_.num_layers));
  index_k_.reserve(size_t(config_.num_layers));
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    latent_.push_back(
        zeroed_pool(backend, config_.num_pages, latent_page_bytes(config_.latent_dtype)));
    index_k_.push_back(
        zeroed_pool(backend, config_.num_pages, index_k_page_bytes(config_.index_k_dtype)));
  }
}

PoolView KvCache::latent(int layer) const {
  require(layer >= 0 && layer < config_.num_layers, ErrorCode::kOutOfRange,
          "latent pool of layer {} requested, the cache has {} layers", layer, config_.num_layers);
  return PoolView{latent_[size_t(layer)].data(), config_.latent_dtype, config_.fp8_scale_rounding,
                  config_.num_pages};
}

PoolView KvCache::index_k(int layer) const {
  require(layer >= 0 && layer < config_.num_layers, ErrorCode::kOutOfRange,
          "index-K pool of layer {} requested, the cache has {} layers", layer, config_.num_layers);
  return PoolView{index_k_[size_t(layer)].data(), config_.index_k_dtype, config_.fp8_scale_rounding,
                  config_.num_pages};
}

}  // namespace dsa
