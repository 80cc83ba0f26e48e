// What a configuration needs in memory, before it is allocated (model.h).
#include <algorithm>
#include <limits>

#include "dsa/error.h"
#include "dsa/file_io.h"
#include "dsa/model.h"

namespace dsa {
namespace {

constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();

uint64_t mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;
}
uint64_t add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? kSaturated : r;
}
uint64_t u(int64_t v) { return v > 0 ? uint64_t(v) : 0; }

std::string gb(uint64_t bytes) {
  return bytes == kSaturated ? std::string("more than 2^64 bytes") : format_gb(bytes);
}

}  // namespace

uint64_t MemoryEstimate::total() const { return add(add(weights, scratch), cache); }

MemoryEstimate estimate_memory(const ModelConfig& c, int64_t max_rows, int64_t max_context,
                               const CacheConfig& cache, WeightDtype weights) {
  MemoryEstimate e;
  for (const WeightSpec& spec : weight_manifest(c)) {
    uint64_t numel = 1;
    for (int64_t d : spec.shape) numel = mul(numel, u(d));
    uint64_t n = mul(numel, sizeof(Bf16));
    if (holds_fp8(weights) && weight_kept_fp8(spec.name, spec.shape)) {
      // One byte a weight, and one f32 scale per 128 x 128 block (Weights::quantize_fp8).
      auto blocks = [](int64_t d) { return (u(d) + kGemmFp8Block - 1) / kGemmFp8Block; };
      n = add(numel, mul(mul(blocks(spec.shape[0]), blocks(spec.shape[1])), sizeof(float)));
    }
    e.weights = add(e.weights, n);
  }
  // The Model's per-row scratch (f32), as its constructor sizes it (x's projections q_a ‖ index
  // key ‖ latent, then q_a normed), plus the MoE routing scratch.
  const uint64_t H = u(c.num_attention_heads), inter = u(c.intermediate_size);
  uint64_t per_row = 0;
  for (uint64_t n :
       {2 * u(c.hidden_size), 2 * u(c.q_lora_rank), mul(H, u(c.qk_head_dim())), u(kLatentDim),
        mul(H, u(kLatentDim)), mul(H, u(kKvLoraRank)), mul(H, u(c.v_head_dim)), mul(3, inter),
        mul(u(c.index_n_heads), kIndexHeadDim), u(kIndexHeadDim), u(c.index_n_heads),
        mul(u(c.index_n_heads), kIndexHeadDim / 4 + 1),  // the query's fp8 encoding and scales
        u(max_context), u(c.n_routed_experts),
        mul(3 * u(c.moe_intermediate_size), u(c.num_experts_per_tok) + u(c.n_shared_experts))}) {
    per_row = add(per_row, n);
  }
  const uint64_t widest =
      std::max<uint64_t>({u(c.hidden_size), u(c.q_lora_rank), inter, mul(H, u(c.v_head_dim)),
                          mul(H, u(c.qk_nope_head_dim)), mul(H, u(kKvLoraRank))});
  per_row = add(add(per_row, widest), mul(u(c.index_topk), 3));  // gemm scratch, top-k outputs
  e.scratch = add(mul(mul(u(max_rows), per_row), sizeof(float)),
                  mul(mul(u(max_context), u(kRopeDim)), sizeof(float)));
  const uint64_t page_bytes =
      add(u(latent_page_bytes(cache.latent_dtype)), u(index_k_page_bytes(cache.index_k_dtype)));
  e.cache = add(mul(mul(u(cache.num_pages), u(cache.num_layers)), page_bytes),
                mul(u(cache.num_pages), sizeof(int32_t) + 1));  // the free list and use marks
  return e;
}

void require_memory_fits(const MemoryEstimate& e, const ModelConfig& config,
                         const CacheConfig& cache, uint64_t limit_bytes, std::string_view what,
                         std::string_view device) {
  if (limit_bytes == 0 || e.total() <= limit_bytes) return;
  fail(ErrorCode::kOutOfRange,
       "{} needs {} (weights {} for {} of {} layers, KV cache {} for {} pages x {} layers, "
       "scratch {}); the {} has {}",
       what, gb(e.total()), gb(e.weights), config.name.empty() ? "the config" : config.name,
       config.num_hidden_layers, gb(e.cache), cache.num_pages, cache.num_layers, gb(e.scratch),
       device, gb(limit_bytes));
}

}  // namespace dsa
