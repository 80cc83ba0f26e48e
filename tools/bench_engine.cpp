// dsa bench-engine: the engine driven directly, in one process, with the workload bench-serve
// --prompt-ids sends over HTTP (random token prompts of --input-len, exactly --output-len new
// tokens, --concurrency requests in flight): the baseline for the server's overhead.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "common.h"
#include "dsa/engine.h"
#include "dsa/error.h"

namespace dsa::tools {
namespace {

struct BenchEngineOpts {
  ModelOptions model;
  std::string mode = "graph";
  int num_prompts = 240, concurrency = 60, input_len = 64, output_len = 64;
  uint64_t seed = 1;
};

int run_bench_engine(const BenchEngineOpts& o) {
  require(o.mode == "eager" || o.mode == "graph", ErrorCode::kInvalidArgument,
          "--mode must be eager or graph, got '{}'", o.mode);
  ModelStack stack = build_model_stack(o.model);
  EngineOptions eo;
  eo.runner.mode = o.mode == "graph" ? RunMode::kGraph : RunMode::kEager;
  Engine engine(*stack.model, *stack.cache, eo);
  using Clock = std::chrono::steady_clock;
  std::mt19937_64 rng(o.seed);
  std::map<int64_t, Clock::time_point> submitted;
  std::vector<double> ttft_ms;
  int next = 0, finished = 0;
  int64_t tokens = 0;
  auto submit = [&] {
    std::vector<int32_t> prompt(size_t(o.input_len), 0);
    for (int32_t& t : prompt) t = std::uniform_int_distribution<int32_t>(3, 258)(rng);
    RequestParams p;
    p.max_new_tokens = o.output_len;
    submitted[engine.submit(std::move(prompt), p)] = Clock::now();
    ++next;
  };
  const Clock::time_point t0 = Clock::now();
  while (finished < o.num_prompts) {
    while (next < o.num_prompts && next - finished < o.concurrency) submit();
    engine.step();
    const Clock::time_point now = Clock::now();
    for (const NewToken& t : engine.new_tokens()) {
      ++tokens;
      auto it = submitted.find(t.request);
      if (it == submitted.end()) continue;
      ttft_ms.push_back(std::chrono::duration<double, std::milli>(now - it->second).count());
      submitted.erase(it);  // only the first token
    }
    for (const RequestOutput& out : engine.take_finished()) {
      require(out.reason == FinishReason::kLength, ErrorCode::kInternal,
              "request {} ended with {}: {}", out.id, finish_reason_name(out.reason), out.message);
      ++finished;
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::sort(ttft_ms.begin(), ttft_ms.end());
  fmt::print(
      "{} requests at concurrency {} ({} + {} tokens) on {}, {} mode: {:.2f} s, "
      "{:.1f} output tok/s, TTFT median {:.3f} ms\n",
      o.num_prompts, o.concurrency, o.input_len, o.output_len, stack.backend->describe(), o.mode, s,
      double(tokens) / s, ttft_ms[ttft_ms.size() / 2]);
  // The engine's own host time per step (step_timing.h): the figure to hold against the device's.
  const EngineStats& st = engine.stats();
  fmt::print(
      "per engine step ({} steps, {} decode rows per decode step): {}\n", st.steps,
      fmt::format("{:.1f}", double(st.decode_rows) / double(std::max<int64_t>(1, st.decode_steps))),
      st.seconds.per_step_us(st.steps).describe_us());
  return 0;
}

}  // namespace

void register_bench_engine(CLI::App& app, SubcommandAction& run) {
  auto o = std::make_shared<BenchEngineOpts>();
  CLI::App* cmd =
      app.add_subcommand("bench-engine",
                         "the engine driven directly with bench-serve --prompt-ids's workload: "
                         "output tok/s, TTFT and the engine's host time per step, the baseline of "
                         "the server's overhead");
  add_model_options(cmd, o->model);
  cmd->add_option("--mode", o->mode, "graph | eager")->capture_default_str();
  cmd->add_option("--num-prompts", o->num_prompts, "requests")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  cmd->add_option("--concurrency", o->concurrency, "requests in flight")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--input-len", o->input_len, "prompt tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--output-len", o->output_len, "new tokens per request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", o->seed, "prompt seed")->capture_default_str();
  cmd->callback([&run, o] { run = [o] { return run_bench_engine(*o); }; });
}

}  // namespace dsa::tools
