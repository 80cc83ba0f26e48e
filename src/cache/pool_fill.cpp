#include "dsa/pool_fill.h"

#include <algorithm>
#include <random>
#include <vector>

#include "dsa/error.h"

namespace dsa {

void fill_pool_random(Backend& be, const PoolView& pool, PoolKind kind, uint64_t seed) {
  constexpr int kChunk = 16384;  // tokens per store call; one random chunk reused for all
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(size_t(kChunk) * kLatentDim);
  for (float& x : values) x = normal(rng);
  DeviceArray<float> d_values(be, values.size());
  be.copy_to_device(d_values.data(), values.data(), values.size() * sizeof(float));
  DeviceArray<int64_t> d_slots(be, kChunk);
  DeviceArray<int32_t> d_n_real(be, 1), d_errors(be, 1);
  be.fill(d_errors.data(), 0, sizeof(int32_t));
  std::vector<int64_t> slots(kChunk);
  for (int64_t first = kPageSize; first < pool.capacity(); first += kChunk) {
    const int n = int(std::min<int64_t>(kChunk, pool.capacity() - first));
    for (int i = 0; i < n; ++i) slots[i] = first + i;
    be.copy_to_device(d_slots.data(), slots.data(), size_t(n) * sizeof(int64_t));
    be.copy_to_device(d_n_real.data(), &n, sizeof(int32_t));
    const SlotBatch batch{d_slots.data(), d_n_real.data(), n, d_errors.data()};
    if (kind == PoolKind::kLatent) {
      StoreLatentKvParams p;
      p.batch = batch;
      p.latent = d_values.data();
      p.k_rope = d_values.data() + kKvLoraRank;
      p.ld_latent = p.ld_rope = kLatentDim;
      p.pool = pool;
      be.store_latent_kv(p);
    } else {
      StoreIndexKParams p;
      p.batch = batch;
      p.k = d_values.data();
      p.ld_k = kLatentDim;
      p.pool = pool;
      be.store_index_k(p);
    }
  }
  int32_t errors = 0;
  be.copy_to_host(&errors, d_errors.data(), sizeof(int32_t));
  require(errors == 0, ErrorCode::kInternal, "filling a pool raised {} store errors", errors);
}

}  // namespace dsa
