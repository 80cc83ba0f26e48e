// Store benches: store_index_k and store_latent_kv, bf16 and fp8, at decode batch sizes (1..256
// tokens, where the floor is an empty launch) and at 1M tokens (where the floor is the bytes
// moved at the measured copy bandwidth). Inputs and slot maps rotate over > 3x L2, so every call
// reads its inputs from HBM and writes pool pages that are not in L2. Slots are page-shuffled:
// pages in random order, tokens in order within a page, as a serving pool hands them out.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dsa/error.h"
#include "dsa/slot.h"

namespace dsa::bench {
namespace {

enum class Layout { kIndexK, kLatent };

constexpr int64_t kTokenCounts[] = {1, 8, 64, 256, 1 << 20};

// Input f32 values per token and bytes written per token.
int64_t input_floats(Layout l) { return l == Layout::kIndexK ? kIndexHeadDim : kLatentDim; }
int64_t pool_token_bytes(Layout l, KvDtype d) {
  return l == Layout::kIndexK ? index_k_page_bytes(d) / kPageSize : latent_token_bytes(d);
}

// Fills device memory with normal values, from a host block copied repeatedly.
void fill_normals(Backend& backend, float* dst, size_t count, std::mt19937_64& gen) {
  std::vector<float> block(size_t(1) << 22);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : block) v = dist(gen);
  for (size_t done = 0; done < count; done += block.size()) {
    backend.copy_to_device(dst + done, block.data(), std::min(block.size(), count - done) * 4);
  }
}

void bench_one(BenchContext& ctx, Layout layout, KvDtype dtype, int64_t tokens,
               std::mt19937_64& gen) {
  Backend& be = ctx.backend;
  const int64_t in_floats = input_floats(layout);
  const double bytes_per_token =
      double(in_floats) * 4 + 8 /* slot */ + double(pool_token_bytes(layout, dtype));
  // Rotate over sets of `tokens` rows until the sets pass kRotateBytes.
  const int64_t sets = BenchContext::rotation_sets(bytes_per_token * double(tokens));
  const int64_t total = sets * tokens;
  const int64_t pages = (total + kPageSize - 1) / kPageSize + 1;  // + the reserved page 0

  std::vector<int64_t> page_order(static_cast<size_t>(pages - 1));
  std::iota(page_order.begin(), page_order.end(), int64_t(1));
  std::shuffle(page_order.begin(), page_order.end(), gen);
  std::vector<int64_t> slots(static_cast<size_t>(total));
  for (int64_t t = 0; t < total; ++t) {
    slots[t] = page_order[t / kPageSize] * kPageSize + t % kPageSize;
  }

  DeviceArray<int64_t> d_slots(be, size_t(total));
  be.copy_to_device(d_slots.data(), slots.data(), d_slots.bytes());
  DeviceArray<float> values(be, size_t(total * in_floats));
  fill_normals(be, values.data(), values.size(), gen);
  const int64_t page_bytes = pool_token_bytes(layout, dtype) * kPageSize;
  DeviceArray<uint8_t> pool(be, size_t(pages * page_bytes));
  be.fill(pool.data(), 0, pool.bytes());
  DeviceArray<int32_t> counters(be, 2);  // n_real, error_count
  const int32_t init[2] = {int32_t(tokens), 0};
  be.copy_to_device(counters.data(), init, sizeof(init));

  const PoolView view{pool.data(), dtype, ScaleRounding::kExact, pages};
  int64_t call = 0;
  auto run = [&] {
    const int64_t set = call++ % sets;
    SlotBatch batch{d_slots.data() + set * tokens, counters.data(), int(tokens),
                    counters.data() + 1};
    const float* in = values.data() + set * tokens * in_floats;
    if (layout == Layout::kIndexK) {
      StoreIndexKParams p;
      p.batch = batch;
      p.k = in;
      p.ld_k = kIndexHeadDim;
      p.pool = view;
      be.store_index_k(p);
    } else {
      StoreLatentKvParams p;
      p.batch = batch;
      p.latent = in;
      p.k_rope = in + kKvLoraRank;
      p.ld_latent = kLatentDim;
      p.ld_rope = kLatentDim;
      p.pool = view;
      be.store_latent_kv(p);
    }
  };
  const bool tiny = tokens <= 256;
  // Small stores are launch-bound: graph-launched back to back, as the empty-kernel floor is.
  const double us = tiny ? ctx.time_graph_us(run, 500) : ctx.time_us(run, 10);
  int32_t after[2] = {0, 0};
  be.copy_to_host(after, counters.data(), sizeof(after));
  require(after[1] == 0, ErrorCode::kInternal, "store bench flagged {} bad slots", after[1]);

  BenchResult r;
  r.name = std::string(layout == Layout::kIndexK ? "store_index_k/" : "store_latent_kv/") +
           kv_dtype_name(dtype) + "/tokens=" + std::to_string(tokens);
  r.us = us;
  r.bytes = bytes_per_token * double(tokens);
  r.floor_us = tiny ? ctx.empty_launch_us : ctx.hbm_floor_us(r.bytes);
  r.floor_kind = tiny ? "launch" : "hbm";
  r.extra = {{"tokens", tokens}, {"rotation_sets", sets}, {"timing", tiny ? "graph" : "stream"}};
  ctx.add(std::move(r));
}

}  // namespace

void run_store_benches(BenchContext& ctx) {
  std::mt19937_64 gen(2024);
  std::puts("store benches");
  for (Layout layout : {Layout::kIndexK, Layout::kLatent}) {
    for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
      for (int64_t tokens : kTokenCounts) bench_one(ctx, layout, dtype, tokens, gen);
    }
  }
}

}  // namespace dsa::bench
