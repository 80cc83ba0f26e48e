// A small model with a graph runner on one cache and an eager runner on a twin cache, kept in
// lockstep, for replay-vs-eager tests.
#pragma once

#include <memory>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <vector>

#include "dsa/generate.h"
#include "dsa/replay_check.h"
#include "dsa/runner.h"

namespace dsa::testing {

// The tiny preset shrunk further (the cache's per-token dims stay real) so thousands of steps
// run in seconds on the CPU.
// Steps whose logits come back too, for bitwise graph-vs-eager comparisons.
inline const StepOutputs kWithLogits = StepOutputs().with_logits();

inline ModelConfig micro_config() {
  ModelConfig c = preset_config("tiny");
  c.name = "micro";
  c.hidden_size = 64;
  c.num_attention_heads = 2;
  c.q_lora_rank = 32;
  c.index_n_heads = 2;
  c.index_topk = 16;
  c.vocab_size = 64;
  c.intermediate_size = 96;
  c.max_position_embeddings = 256;
  c.first_k_dense_replace = c.num_hidden_layers;
  return c;
}

// The randomized replay check on the micro model: 16 live sequences of up to 96 tokens over a
// pool that holds them with no spare page, so freed pages are reused at once.
inline ReplayCheckReport run_micro_check(BackendKind kind, KvDtype index_k, int steps,
                                         FaultSet faults, RunMode mode = RunMode::kGraph) {
  auto backend = make_backend(kind);
  const ModelConfig config = micro_config();
  Model model(*backend, config, Weights::synthetic(*backend, config, 5), 16, 128);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  cc.num_pages = 1 + 16 * 2;
  cc.index_k_dtype = index_k;
  ReplayCheckOptions o;
  o.steps = steps;
  o.seed = 2026;
  o.faults = faults;
  o.mode = mode;
  o.buckets = {1, 2, 4, 8, 12, 16};
  o.max_request_tokens = 96;
  return run_replay_check(model, cc, o);
}

// Every byte of every pool of a cache, in the order latent(0), index-K(0), latent(1), ...
inline std::vector<std::vector<uint8_t>> snapshot(Backend& be, const KvCache& cache) {
  std::vector<std::vector<uint8_t>> out;
  const CacheConfig& c = cache.config();
  for (int l = 0; l < c.num_layers; ++l) {
    const PoolView latent = cache.latent(l), index_k = cache.index_k(l);
    for (auto [pool, page_bytes] : {std::pair{latent, latent_page_bytes(c.latent_dtype)},
                                    std::pair{index_k, index_k_page_bytes(c.index_k_dtype)}}) {
      std::vector<uint8_t> host(size_t(pool.num_pages * page_bytes));
      be.copy_to_host(host.data(), pool.data, host.size());
      out.push_back(std::move(host));
    }
  }
  return out;
}

// The exact slots whose bytes differ between two snapshots (any layer, any pool): a stray write
// into another slot of a page that also got a real write shows as that slot. Shared by the CPU
// graph tests and their CUDA twins in tests/parity.
inline std::set<int64_t> changed_slots(const KvCache& cache,
                                       const std::vector<std::vector<uint8_t>>& a,
                                       const std::vector<std::vector<uint8_t>>& b) {
  std::set<int64_t> slots;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool latent = i % 2 == 0;
    const KvDtype dt = latent ? cache.config().latent_dtype : cache.config().index_k_dtype;
    for (size_t byte = 0; byte < a[i].size(); ++byte) {
      if (a[i][byte] == b[i][byte]) continue;
      if (latent) {
        slots.insert(int64_t(byte) / latent_token_bytes(dt));
      } else {
        const int64_t page = int64_t(byte) / index_k_page_bytes(dt);
        const int64_t in_page = int64_t(byte) % index_k_page_bytes(dt);
        const int64_t values = kPageSize * kIndexHeadDim * (dt == KvDtype::kBf16 ? 2 : 1);
        const int64_t off =
            in_page < values ? in_page / (values / kPageSize) : (in_page - values) / 4;
        slots.insert(page * kPageSize + off);
      }
    }
  }
  return slots;
}

struct GraphFixture {
  struct Request {
    PageTable graph_pages, eager_pages;
    int32_t length = 0;
    int32_t next_token = 0;
  };

  GraphFixture(const ModelConfig& config, KvDtype index_k, std::vector<int> buckets,
               FaultSet faults = {}, BackendKind kind = BackendKind::kCpu) {
    backend = make_backend(kind);
    model = std::make_unique<Model>(*backend, config, Weights::synthetic(*backend, config, 11),
                                    /*max_rows=*/64, /*max_context=*/256);
    CacheConfig cc;
    cc.num_layers = config.num_hidden_layers;
    cc.num_pages = 64;
    cc.index_k_dtype = index_k;
    graph_cache = std::make_unique<KvCache>(*backend, cc);
    eager_cache = std::make_unique<KvCache>(*backend, cc);
    graph = std::make_unique<Runner>(*model, *graph_cache,
                                     RunnerOptions{RunMode::kGraph, std::move(buckets), faults});
    eager = std::make_unique<Runner>(*model, *eager_cache, RunnerOptions{});
  }

  // n requests with random prompts of 5..40 tokens, prefilled eagerly into both caches.
  void start_requests(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < n; ++i) {
      Request r;
      const int len = int(rng() % 36) + 5;
      reserve(r, len);
      std::vector<RowInput> rows;
      for (int t = 0; t < len; ++t) {
        rows.push_back({int32_t(rng() % model->config().vocab_size), t, r.graph_pages.slot(t),
                        t + 1, r.graph_pages.pages()});
      }
      StepResult g = graph->step_eager(rows, kWithLogits);
      eager->step_eager(rows);
      r.length = len;
      r.next_token = g.tokens.back();
      const std::span<const float> last(g.logits.data() + (len - 1) * model->config().vocab_size,
                                        size_t(model->config().vocab_size));
      if (r.next_token != argmax(last)) throw std::runtime_error("the greedy draw is not argmax");
      requests.push_back(std::move(r));
    }
  }

  // The next decode row of each listed request (pages reserved in both caches).
  std::vector<RowInput> decode_rows(const std::vector<int>& which) {
    std::vector<RowInput> rows;
    for (int i : which) {
      Request& r = requests[i];
      reserve(r, r.length + 1);
      rows.push_back({r.next_token, r.length, r.graph_pages.slot(r.length), r.length + 1,
                      r.graph_pages.pages()});
    }
    return rows;
  }

  void advance(const std::vector<int>& which, const StepResult& result) {
    for (size_t k = 0; k < which.size(); ++k) {
      Request& r = requests[which[k]];
      r.next_token = result.tokens[k];
      ++r.length;
    }
  }

  void reserve(Request& r, int tokens) {
    if (!r.graph_pages.reserve(tokens, graph_cache->allocator()) ||
        !r.eager_pages.reserve(tokens, eager_cache->allocator()) ||
        r.graph_pages.pages() != r.eager_pages.pages()) {
      throw std::runtime_error("fixture caches out of pages or out of lockstep");
    }
  }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> graph_cache, eager_cache;
  std::unique_ptr<Runner> graph, eager;
  std::vector<Request> requests;
};

}  // namespace dsa::testing
