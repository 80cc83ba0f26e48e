// The benchmarks' pool filler writes through the guarded store ops: page 0 stays zero, every
// other slot holds a valid, non-zero token.
#include <gtest/gtest.h>

#include <cmath>

#include "dsa/pool_fill.h"
#include "dsa/token_codec.h"

namespace dsa {
namespace {

TEST(PoolFill, EverySlotButPageZeroGetsAValidToken) {
  auto be = make_cpu_backend();
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    for (PoolKind kind : {PoolKind::kLatent, PoolKind::kIndexK}) {
      const int64_t pages = 5;
      const int64_t page_bytes =
          kind == PoolKind::kLatent ? latent_page_bytes(dtype) : index_k_page_bytes(dtype);
      std::vector<uint8_t> bytes(size_t(pages * page_bytes), 0xA5);
      std::fill(bytes.begin(), bytes.begin() + page_bytes, 0);
      const PoolView pool{bytes.data(), dtype, ScaleRounding::kExact, pages};
      fill_pool_random(*be, pool, kind, 7);
      for (int64_t i = 0; i < page_bytes; ++i) ASSERT_EQ(bytes[size_t(i)], 0) << "page 0 written";
      std::vector<float> out(kLatentDim);
      for (int64_t slot = kPageSize; slot < pool.capacity(); ++slot) {
        double sum_abs = 0;
        if (kind == PoolKind::kLatent) {
          decode_latent_token(pool, slot, out.data());
          for (int d = 0; d < kLatentDim; ++d) sum_abs += std::fabs(out[d]);
        } else {
          const float scale = decode_index_k_token(pool, slot, out.data());
          ASSERT_TRUE(std::isfinite(scale) && scale > 0);
          for (int d = 0; d < kIndexHeadDim; ++d) sum_abs += std::fabs(out[d]);
        }
        ASSERT_TRUE(std::isfinite(sum_abs) && sum_abs > 0) << "slot " << slot;
      }
    }
  }
}

}  // namespace
}  // namespace dsa
