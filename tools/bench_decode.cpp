// dsa bench-decode: one decode step, graph replay against eager, for several batch sizes, and the
// cost of padding (B real rows replayed in a larger bucket G). --profile adds, per batch size, the
// eager step's ops one by one (stopwatch points around each) against their floors.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "common.h"
#include "dsa/checkpoint.h"
#include "dsa/error.h"
#include "dsa/pool_fill.h"
#include "dsa/runner.h"
#include "op_profile.h"

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

void register_bench_decode(CLI::App& app, SubcommandAction& run) {
  struct Opts {
    ModelOptions model;
    int layers = 1, context = 0, iters = 20;
    std::vector<int> batches = {1, 8, 64, 256};
    std::string json;
    bool profile = false;
    Ceilings ceilings;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("bench-decode", "time one decode step: graph replay vs eager");
  add_model_source_options(cmd, o->model);
  add_int_option(cmd, "--layers", o->layers, 0, 256, "layers to keep from the model (0: all)");
  add_int_option(cmd, "--context", o->context, 0, kMaxContextLimit,
                 "tokens each row attends to (0: 4096, or less when the model's positions end "
                 "sooner)");
  add_int_option(cmd, "--batches", o->batches, 1, kMaxRowsLimit,
                 "batch sizes (each also a graph bucket)");
  add_int_option(cmd, "--iters", o->iters, 1, 100000, "timed steps per point");
  cmd->add_option("--json", o->json, "write the results here")->check(non_empty("a file name"));
  cmd->add_flag("--profile", o->profile,
                "per batch size, time every op of an eager step and compare it with its floor");
  cmd->add_option("--peak-gbps", o->ceilings.gb_per_s,
                  "memory bandwidth for the floors, GB/s (default: a device copy timed in this "
                  "run)")
      ->check(positive_number());
  cmd->add_option("--peak-tflops", o->ceilings.tflop_per_s,
                  "matrix rate for the floors, TFLOP/s (default: a square bf16 GEMM timed in "
                  "this run with --gemm fast)")
      ->check(positive_number());
  cmd->callback([&run, o] {
    run = [o] {
      const ModelConfig config = keep_first_layers(resolve_config(o->model), o->layers);
      const int max_b = *std::max_element(o->batches.begin(), o->batches.end());
      const int context =
          o->context > 0 ? o->context : std::min(4096, config.max_position_embeddings - 1);
      require(context >= 2 && context < config.max_position_embeddings, ErrorCode::kInvalidArgument,
              "--context {} must be in [2, {}] (max_position_embeddings - 1)", context,
              config.max_position_embeddings - 1);
      CacheConfig cc;
      cc.num_layers = config.num_hidden_layers;
      const int64_t pages_per_row = (context + 1 + kPageSize - 1) / kPageSize;
      cc.num_pages = 1 + pages_per_row * max_b;
      cc.index_k_dtype = parse_kv_dtype(o->model.index_k, "--index-k");
      cc.latent_dtype = parse_kv_dtype(o->model.latent, "--latent");
      cc.fp8_scale_rounding = o->model.ue8m0 ? ScaleRounding::kUe8m0 : ScaleRounding::kExact;
      apply_mla_splits(o->model.mla_splits, parse_backend(o->model.backend));
      apply_mla_kernel(o->model.mla_kernel, parse_backend(o->model.backend));
      auto device = make_backend(parse_backend(o->model.backend));
      check_memory(*device, config, max_b, context + 1, cc, parse_weight_dtype(o->model.weights));
      device->set_gemm_mode(parse_gemm_mode(o->model.gemm));
      // The profile's floors come from this device, timed before the model takes its memory.
      if (o->profile) {
        o->ceilings =
            measure_ceilings(*device, o->ceilings, ceiling_probe(parse_backend(o->model.backend)));
        fmt::print(stderr, "bench-decode: floors at {}\n", o->ceilings.describe());
      }
      ProfilingBackend profiler(*device);  // forwards only, until a profile starts recording
      Backend* backend = &profiler;
      fmt::print(stderr, "bench-decode: building {} ({} layers) on {}\n", config.name,
                 config.num_hidden_layers, backend->describe());
      Weights weights = load_model_weights(*backend, o->model, config);
      Model model(*backend, config, std::move(weights), max_b, context + 1);
      KvCache cache(*backend, cc);
      fill_cache(*backend, cache, 1);

      std::vector<PageTable> tables(static_cast<size_t>(max_b));
      for (auto& t : tables) t.reserve(context + 1, cache.allocator());
      auto rows_for = [&](int b) {
        std::vector<RowInput> rows;
        for (int r = 0; r < b; ++r) {
          rows.push_back({r % config.vocab_size, context, tables[r].slot(context), context + 1,
                          tables[r].pages()});
        }
        return rows;
      };
      RunnerOptions ro;
      ro.mode = RunMode::kGraph;
      ro.buckets = o->batches;
      dsa::Runner runner(model, cache, ro);
      // Median wall time of a step (ms), and of its host part: the wall time less the wait for
      // the device at the step's end (us).
      struct StepTime {
        double ms, host_us;
      };
      auto time_step = [&](const std::vector<RowInput>& rows, RunMode mode) {
        const bool graph = mode == RunMode::kGraph;
        for (int i = 0; i < 3; ++i) graph ? runner.step(rows) : runner.step_eager(rows);
        std::vector<double> ms, host_us;
        for (int i = 0; i < o->iters; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          const StepResult r = graph ? runner.step(rows) : runner.step_eager(rows);
          ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
          host_us.push_back(1e3 * ms.back() - r.wait_us);
        }
        return StepTime{median_ms(ms), median_ms(host_us)};
      };
      // The eager step's ops, medians over --iters recorded steps, printed after the row of b.
      auto profile_step = [&](const std::vector<RowInput>& rows, double eager_ms, double graph_ms) {
        std::vector<std::vector<OpTiming>> runs;
        for (int i = 0; i < o->iters; ++i) {
          profiler.start();
          runner.step_eager(rows);
          runs.push_back(profiler.finish());
        }
        const std::vector<OpTiming> ops = median_timings(runs);
        const double empty_us = profiler.empty_launch_us(std::max(o->iters, 20));
        nlohmann::json j = profile_json(ops, o->ceilings, empty_us);
        const double sum_ms = j["sum_us"].get<double>() / 1e3;
        fmt::print("\nB = {}: the eager step's ops (median of {} steps)\n{}", rows.size(), o->iters,
                   profile_table(ops, o->ceilings, empty_us));
        fmt::print(
            "graph step {:.3f} ms = {:.2f}x the sum of its ops ({:.3f} ms); eager step "
            "{:.3f} ms; floor {:.3f} ms\n\n",
            graph_ms, graph_ms / sum_ms, sum_ms, eager_ms, j["floor_us"].get<double>() / 1e3);
        j["graph_over_sum"] = graph_ms / sum_ms;
        return j;
      };
      nlohmann::json results = nlohmann::json::array();
      fmt::print("{:>5} {:>12} {:>12} {:>9} {:>14} {:>16} {:>12}\n", "B", "eager ms", "graph ms",
                 "speedup", "graph host us", "padded B-1 in B", "pad cost");
      for (int b : o->batches) {
        const StepTime eager = time_step(rows_for(b), RunMode::kEager);
        const StepTime graph = time_step(rows_for(b), RunMode::kGraph);
        // Padding: b-1 real rows replayed in bucket b, against b-1 rows eagerly.
        double padded = 0, eager_small = 0;
        if (b > 1) {
          padded = time_step(rows_for(b - 1), RunMode::kGraph).ms;
          eager_small = time_step(rows_for(b - 1), RunMode::kEager).ms;
        }
        fmt::print("{:>5} {:>12.3f} {:>12.3f} {:>8.2f}x {:>14.1f} {:>16.3f} {:>11.2f}x\n", b,
                   eager.ms, graph.ms, eager.ms / graph.ms, graph.host_us, padded,
                   b > 1 ? padded / graph.ms : 1.0);
        results.push_back({{"batch", b},
                           {"eager_ms", eager.ms},
                           {"graph_ms", graph.ms},
                           {"speedup", eager.ms / graph.ms},
                           {"eager_host_us", eager.host_us},
                           {"graph_host_us", graph.host_us},
                           {"padded_rows", b - 1},
                           {"padded_graph_ms", padded},
                           {"eager_small_ms", eager_small}});
        if (o->profile) results.back()["profile"] = profile_step(rows_for(b), eager.ms, graph.ms);
      }
      if (!o->json.empty()) {
        nlohmann::json j = {{"model", config.name},        {"layers", config.num_hidden_layers},
                            {"context", context},          {"backend", backend->describe()},
                            {"index_k", o->model.index_k}, {"latent", o->model.latent},
                            {"gemm", o->model.gemm},       {"weights", o->model.weights},
                            {"results", results}};
        write_result_file(o->json, j.dump(2) + "\n", "--json");
      }
      return 0;
    };
  });
}

}  // namespace dsa::tools
