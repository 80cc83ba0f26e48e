// The shadow oracle: host-side expected bytes of every live slot, compared with the pools.
#include "dsa/shadow_oracle.h"

#include <cstring>

#include "dsa/error.h"
#include "dsa/token_codec.h"

namespace dsa {

ShadowOracle::ShadowOracle(Backend& backend, const KvCache& cache)
    : backend_(backend), cache_(cache) {
  const size_t bytes = size_t(cache_.config().num_layers) * (latent_bytes() + index_k_bytes());
  for (int64_t s = 0; s < kPageSize; ++s) live_[s] = {-1, std::vector<uint8_t>(bytes, 0)};
}

int64_t ShadowOracle::latent_bytes() const {
  return latent_token_bytes(cache_.config().latent_dtype);
}

int64_t ShadowOracle::index_k_bytes() const {
  return cache_.config().index_k_dtype == KvDtype::kBf16 ? kIndexHeadDim * 2 : kIndexHeadDim + 4;
}

void ShadowOracle::write(std::span<const int64_t> slots, std::span<const int64_t> owners,
                         std::span<const float> values) {
  const CacheConfig& c = cache_.config();
  const size_t n = slots.size();
  require(owners.size() == n && values.size() == size_t(c.num_layers) * n * kStoreValuesDim,
          ErrorCode::kInvalidArgument,
          "oracle: {} slots need {} owners and {} values, got {} and {}", n, n,
          size_t(c.num_layers) * n * kStoreValuesDim, owners.size(), values.size());
  const int64_t lat = latent_bytes(), ik = index_k_bytes();
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] < kPageSize || slots[i] >= cache_.capacity_slots()) continue;
    Shadow sh{owners[i], std::vector<uint8_t>(size_t(c.num_layers * (lat + ik)))};
    for (int l = 0; l < c.num_layers; ++l) {
      const float* v = values.data() + (size_t(l) * n + i) * kStoreValuesDim;
      uint8_t* dst = sh.bytes.data() + l * (lat + ik);
      encode_latent_bytes(c.latent_dtype, c.fp8_scale_rounding, v, v + kKvLoraRank, dst);
      float scale = 0.0f;
      encode_index_k_bytes(c.index_k_dtype, c.fp8_scale_rounding, v + kLatentDim, dst + lat,
                           &scale);
      if (c.index_k_dtype == KvDtype::kFp8) std::memcpy(dst + lat + kIndexHeadDim, &scale, 4);
    }
    live_[slots[i]] = std::move(sh);
  }
}

void ShadowOracle::forget(std::span<const int64_t> slots) {
  for (int64_t s : slots) {
    if (s >= kPageSize) live_.erase(s);
  }
}

std::vector<Clobber> ShadowOracle::compare(int64_t step) {
  const CacheConfig& c = cache_.config();
  const int64_t lat = latent_bytes(), ik = index_k_bytes();
  std::vector<Clobber> found;
  std::vector<uint8_t> host;
  for (int l = 0; l < c.num_layers; ++l) {
    for (PoolKind kind : {PoolKind::kLatent, PoolKind::kIndexK}) {
      const bool latent = kind == PoolKind::kLatent;
      PoolView pool = latent ? cache_.latent(l) : cache_.index_k(l);
      const int64_t page_bytes =
          latent ? latent_page_bytes(pool.dtype) : index_k_page_bytes(pool.dtype);
      host.resize(size_t(pool.num_pages * page_bytes));
      backend_.copy_to_host(host.data(), pool.data, host.size());
      pool.data = host.data();  // the same layout, read on the host
      for (auto& [slot, shadow] : live_) {
        const SlotBytes b = latent ? latent_slot_bytes(pool, slot) : index_k_slot_bytes(pool, slot);
        uint8_t* want = shadow.bytes.data() + l * (lat + ik) + (latent ? 0 : lat);
        const bool same =
            std::memcmp(b.first, want, size_t(b.first_len)) == 0 &&
            (!b.second || std::memcmp(b.second, want + b.first_len, size_t(b.second_len)) == 0);
        if (same) continue;
        found.push_back({l, kind, slot, shadow.owner, step});
        std::memcpy(want, b.first, size_t(b.first_len));
        if (b.second) std::memcpy(want + b.first_len, b.second, size_t(b.second_len));
      }
    }
  }
  return found;
}

namespace {
std::pair<int64_t, int> key(int layer, PoolKind pool, int64_t slot) {
  return {slot, layer * 2 + (pool == PoolKind::kLatent ? 0 : 1)};
}
}  // namespace

void RecallTally::saw_clobbers(std::span<const Clobber> clobbers) {
  for (const Clobber& c : clobbers) {
    ++clobbers_;
    ++unmatched_[key(c.layer, c.pool, c.slot)];
  }
}

void RecallTally::saw_findings(std::span<const AuditFinding> findings) {
  for (const AuditFinding& f : findings) {
    auto it = unmatched_.find(key(f.layer, f.pool, f.slot));
    if (it == unmatched_.end()) {
      ++unconfirmed_;
      continue;
    }
    found_ += it->second;
    unmatched_.erase(it);
  }
}

void RecallTally::released(std::span<const int64_t> slots) {
  for (int64_t s : slots) {
    unmatched_.erase(unmatched_.lower_bound({s, 0}), unmatched_.lower_bound({s + 1, 0}));
  }
}

}  // namespace dsa
