// dsa generate: greedy, deterministic decode of one prompt with synthetic weights.
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "common.h"
#include "dsa/error.h"
#include "dsa/generate.h"
#include "dsa/runner.h"

namespace dsa::tools {

void register_generate(CLI::App& app, SubcommandAction& run) {
  struct Opts {
    ModelOptions model;
    std::string prompt, prompt_file, mode = "eager", inject;
    int max_tokens = 32;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("generate", "greedy decode of one prompt (byte tokens)");
  add_model_options(cmd, o->model);
  auto* prompt = cmd->add_option("--prompt", o->prompt, "prompt text");
  cmd->add_option("--prompt-file", o->prompt_file, "read the prompt from a file")
      ->check(CLI::ExistingFile)
      ->excludes(prompt);
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--mode", o->mode, "eager | graph")->capture_default_str();
  cmd->add_option("--inject", o->inject, "faults: stale-padding,unguarded-store (testing only)");
  cmd->callback([&run, o] {
    run = [o] {
      std::string text = o->prompt;
      if (!o->prompt_file.empty()) {
        std::ifstream in(o->prompt_file, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        text = ss.str();
      }
      require(!text.empty(), ErrorCode::kInvalidArgument,
              "give a prompt with --prompt TEXT or --prompt-file PATH");
      require(o->mode == "eager" || o->mode == "graph", ErrorCode::kInvalidArgument,
              "--mode must be eager or graph, got '{}'", o->mode);
      ModelStack stack = build_model_stack(o->model);
      RunnerOptions ro;
      ro.mode = o->mode == "graph" ? RunMode::kGraph : RunMode::kEager;
      ro.faults = parse_faults(o->inject);
      ro.buckets.erase(std::remove_if(ro.buckets.begin(), ro.buckets.end(),
                                      [&](int b) { return b > o->model.max_rows; }),
                       ro.buckets.end());
      dsa::Runner runner(*stack.model, *stack.cache, ro);
      const auto prompt_tokens = byte_tokens(text);
      GenerateStats stats;
      const auto t0 = std::chrono::steady_clock::now();
      const auto out = generate_greedy(runner, *stack.cache, *stack.model, prompt_tokens,
                                       o->max_tokens, -1, &stats);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print("{}\n", byte_text(out));
      fmt::print(stderr,
                 "generated {} tokens after a {}-token prompt in {:.3f} s ({:.1f} tok/s) on {} | "
                 "preset {}, index-K {}, latent {}, mode {}, store errors {}\n",
                 stats.new_tokens, stats.prompt_tokens, s, stats.new_tokens / s,
                 stack.backend->describe(), o->model.preset, o->model.index_k, o->model.latent,
                 o->mode, stats.store_errors);
      return stats.store_errors == 0 ? 0 : 1;
    };
  });
}

}  // namespace dsa::tools
