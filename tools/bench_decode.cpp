// dsa bench-decode: one decode step, graph replay against eager, for several batch sizes, and the
// cost of padding (B real rows replayed in a larger bucket G).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common.h"
#include "dsa/error.h"
#include "dsa/pool_fill.h"
#include "dsa/runner.h"

namespace dsa::tools {
namespace {

// Every pool full of valid random tokens, through the guarded writers: the step's reads cost
// what real data costs, without prefilling millions of tokens through the model.
void fill_cache(Backend& be, KvCache& cache, uint64_t seed) {
  for (int l = 0; l < cache.config().num_layers; ++l) {
    fill_pool_random(be, cache.latent(l), PoolKind::kLatent, seed + 2 * l);
    fill_pool_random(be, cache.index_k(l), PoolKind::kIndexK, seed + 2 * l + 1);
  }
}

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void register_bench_decode(CLI::App& app, Runner& run) {
  struct Opts {
    ModelOptions model;
    int layers = 1, context = 4096, iters = 20;
    std::vector<int> batches = {1, 8, 64, 256};
    std::string gemm = "invariant", json;
  };
  auto o = std::make_shared<Opts>();
  o->model.max_rows = 256;
  CLI::App* cmd = app.add_subcommand("bench-decode", "time one decode step: graph replay vs eager");
  add_model_options(cmd, o->model);
  cmd->add_option("--layers", o->layers, "layers to keep from the preset (0: all)")
      ->capture_default_str();
  cmd->add_option("--context", o->context, "tokens each row attends to")->capture_default_str();
  cmd->add_option("--batches", o->batches, "batch sizes (each also a graph bucket)");
  cmd->add_option("--iters", o->iters, "timed steps per point")->capture_default_str();
  cmd->add_option("--gemm", o->gemm, "invariant | fast")->capture_default_str();
  cmd->add_option("--json", o->json, "write the results here");
  cmd->callback([&run, o] {
    run = [o] {
      ModelConfig config = preset_config(o->model.preset);
      if (o->layers > 0) config.num_hidden_layers = std::min(o->layers, config.num_hidden_layers);
      config.first_k_dense_replace =
          std::min(config.first_k_dense_replace, config.num_hidden_layers);
      const int max_b = *std::max_element(o->batches.begin(), o->batches.end());
      require(o->context >= 2 && o->context <= config.max_position_embeddings,
              ErrorCode::kInvalidArgument, "--context {} must be in [2, {}]", o->context,
              config.max_position_embeddings);
      auto backend = make_backend(parse_backend(o->model.backend));
      backend->set_gemm_mode(o->gemm == "fast" ? GemmMode::kFast : GemmMode::kBatchInvariant);
      fmt::print(stderr, "bench-decode: building {} ({} layers) on {}\n", config.name,
                 config.num_hidden_layers, backend->describe());
      Model model(*backend, config, Weights::synthetic(*backend, config, o->model.seed), max_b,
                  o->context + 1);
      CacheConfig cc;
      cc.num_layers = config.num_hidden_layers;
      const int64_t pages_per_row = (o->context + 1 + kPageSize - 1) / kPageSize;
      cc.num_pages = 1 + pages_per_row * max_b;
      cc.index_k_dtype = parse_kv_dtype(o->model.index_k, "--index-k");
      cc.latent_dtype = parse_kv_dtype(o->model.latent, "--latent");
      KvCache cache(*backend, cc);
      fill_cache(*backend, cache, 1);

      std::vector<PageTable> tables(static_cast<size_t>(max_b));
      for (auto& t : tables) t.reserve(o->context + 1, cache.allocator());
      auto rows_for = [&](int b) {
        std::vector<RowInput> rows;
        for (int r = 0; r < b; ++r) {
          rows.push_back({r % config.vocab_size, o->context, tables[r].slot(o->context),
                          o->context + 1, tables[r].pages()});
        }
        return rows;
      };
      RunnerOptions ro;
      ro.mode = RunMode::kGraph;
      ro.buckets = o->batches;
      dsa::Runner runner(model, cache, ro);
      auto time_step = [&](const std::vector<RowInput>& rows, bool graph) {
        for (int i = 0; i < 3; ++i) graph ? runner.step(rows) : runner.step_eager(rows);
        std::vector<double> ms;
        for (int i = 0; i < o->iters; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          graph ? runner.step(rows) : runner.step_eager(rows);
          ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        return median_ms(ms);
      };
      nlohmann::json results = nlohmann::json::array();
      fmt::print("{:>5} {:>12} {:>12} {:>9} {:>16} {:>12}\n", "B", "eager ms", "graph ms",
                 "speedup", "padded B-1 in B", "pad cost");
      for (int b : o->batches) {
        const double eager = time_step(rows_for(b), false);
        const double graph = time_step(rows_for(b), true);
        // Padding: b-1 real rows replayed in bucket b, against b-1 rows eagerly.
        double padded = 0, eager_small = 0;
        if (b > 1) {
          padded = time_step(rows_for(b - 1), true);
          eager_small = time_step(rows_for(b - 1), false);
        }
        fmt::print("{:>5} {:>12.3f} {:>12.3f} {:>8.2f}x {:>16.3f} {:>11.2f}x\n", b, eager, graph,
                   eager / graph, padded, b > 1 ? padded / graph : 1.0);
        results.push_back({{"batch", b},
                           {"eager_ms", eager},
                           {"graph_ms", graph},
                           {"speedup", eager / graph},
                           {"padded_rows", b - 1},
                           {"padded_graph_ms", padded},
                           {"eager_small_ms", eager_small}});
      }
      if (!o->json.empty()) {
        nlohmann::json j = {{"preset", config.name},
                            {"layers", config.num_hidden_layers},
                            {"context", o->context},
                            {"backend", backend->describe()},
                            {"index_k", o->model.index_k},
                            {"latent", o->model.latent},
                            {"gemm", o->gemm},
                            {"results", results}};
        std::ofstream(o->json) << j.dump(2) << "\n";
      }
      return 0;
    };
  });
}

}  // namespace dsa::tools
