// dsa stress: concurrent multi-turn sessions against the engine, across the incident's matrix,
// with the auditor and reference divergence on every session. Prints the incident's table.
//
// CPU defaults are smaller than the CUDA ones (12 sessions at concurrency 8 instead of 60 at 60)
// so the whole matrix runs in about a minute on two cores; --sessions and --concurrency override.
#include "dsa/stress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "common.h"
#include "dsa/error.h"

namespace dsa::tools {
namespace {

struct StressOpts {
  std::string preset = "tiny", backend = "cpu", index_k = "all", mode = "all", faults = "all";
  std::string policy = "keep", audit_scope = "all", prefix_cache = "all", json, plot;
  std::string mla_splits;
  std::string mla_kernel;
  uint64_t weight_seed = 0;
  int max_rows = 64;
  int layers = 0;
  int64_t pages = 0;
  bool no_audit = false, no_reference = false, quiet = false, allow_slow_cpu = false;
  StressShape shape;
};

std::vector<StressCell> select_cells(const StressOpts& o) {
  auto pick = [](const std::string& v, const char* flag, const char* a, const char* b) {
    require(v == "all" || v == a || v == b, ErrorCode::kInvalidArgument,
            "{} must be {}, {} or all, got '{}'", flag, a, b, v);
    return v;
  };
  const std::string index_k = pick(o.index_k, "--index-k", "bf16", "fp8");
  const std::string mode = pick(o.mode, "--mode", "eager", "graph");
  std::string faults = o.faults;
  if (faults != "all" && faults != "guarded") {  // a fault list, as --inject takes it
    const FaultSet f = parse_faults(faults);
    require(f.stale_padding && f.unguarded_store, ErrorCode::kInvalidArgument,
            "--faults must be guarded, incident (stale-padding,unguarded-store) or all, got '{}'",
            faults);
    faults = "incident";
  }
  const std::string prefix = pick(o.prefix_cache, "--prefix-cache", "on", "off");
  std::vector<StressCell> cells;
  for (const StressCell& c : stress_matrix()) {
    if (prefix != "all" && (prefix == "on") != c.prefix_cache) continue;
    if (index_k != "all" && index_k != kv_dtype_name(c.index_k)) continue;
    if (mode != "all" && mode != (c.runner == RunMode::kGraph ? "graph" : "eager")) continue;
    if (faults != "all" && (faults == "incident") != c.faults) continue;
    cells.push_back(c);
  }
  return cells;
}

AuditScope parse_scope(const std::string& s) {
  if (s == "all") return AuditScope::kAll;
  if (s == "read") return AuditScope::kListed;
  if (s == "sample") return AuditScope::kSample;
  fail(ErrorCode::kInvalidArgument, "--audit-scope must be all, read or sample, got '{}'", s);
}

// The scalar CPU backend is the specification, not a fast path: a workload of many TFLOP (the
// v32 preset's matrix) would run for hours without a word. Refused, with the estimate, unless
// --allow-slow-cpu.
void refuse_slow_cpu_run(const StressConfig& c) {
  constexpr double kCpuFlopLimit = 1e13;
  const ModelConfig config = stress_model_config(c);
  const double params = double(estimate_memory(config, 1, 1, CacheConfig{}).weights) / 2;
  const StressShape& s = c.shape;
  // Every session runs once per cell and once alone as the reference; each token costs about
  // 2 FLOP per parameter.
  const double tokens = double(s.sessions) * double(c.cells.size() + 1) * s.max_turns *
                        (double(s.max_prompt) + s.max_reply);
  const double flop = 2 * params * tokens;
  require(flop <= kCpuFlopLimit, ErrorCode::kInvalidArgument,
          "stress --preset {} on the cpu backend: up to {:.2g} tokens through {:.2g} parameters "
          "is about {:.2g} FLOP, hours on the scalar CPU backend (this check refuses more than "
          "{:.0g}); run it with --backend cuda, shrink the workload, or give --allow-slow-cpu",
          c.preset, tokens, params, flop, kCpuFlopLimit);
}

void print_progress(const StressProgress& p) {
  const std::string line =
      p.cell < 0 ? fmt::format("{}: {}/{} sessions", p.phase, p.sessions_done, p.sessions)
                 : fmt::format("[{}/{}] {}: {}/{} sessions, {} corrupted, {:.0f} tok/s", p.cell + 1,
                               p.cells, p.phase, p.sessions_done, p.sessions, p.corrupted,
                               p.seconds > 0 ? p.tokens / p.seconds : 0.0);
  fmt::print(stderr, "\r{:<100}", line);
  std::fflush(stderr);
}

int run_stress_command(StressOpts& o) {
  const BackendKind backend = parse_backend(o.backend);
  const bool cpu = backend == BackendKind::kCpu;
  if (o.shape.sessions == 0) o.shape.sessions = cpu ? 12 : 60;
  if (o.shape.concurrency == 0) o.shape.concurrency = std::min(o.shape.sessions, cpu ? 8 : 60);
  require(o.policy == "keep" || o.policy == "recompute", ErrorCode::kInvalidArgument,
          "--policy must be keep or recompute, got '{}'", o.policy);
  o.shape.policy = o.policy == "keep" ? SessionPolicy::kKeepCache : SessionPolicy::kRecompute;

  StressConfig c;
  c.preset = o.preset;
  c.layers = o.layers;
  c.backend = backend;
  c.weight_seed = o.weight_seed;
  c.max_rows = o.max_rows;
  c.pages = o.pages;
  c.shape = o.shape;
  c.cells = select_cells(o);
  c.audit = !o.no_audit;
  c.compare_reference = !o.no_reference;
  c.audit_scope = parse_scope(o.audit_scope);
  require(!c.cells.empty(), ErrorCode::kInvalidArgument, "no cell matches the flags");
  if (cpu && !o.allow_slow_cpu) refuse_slow_cpu_run(c);
  apply_mla_splits(o.mla_splits, backend);
  apply_mla_kernel(o.mla_kernel, backend);

  StressProgressFn progress;
  if (!o.quiet) progress = print_progress;
  const StressReport report = run_stress(c, progress);
  if (!o.quiet) fmt::print(stderr, "\r{:<100}\r", "");

  fmt::print("{}", stress_table(report));
  int64_t tokens = 0;
  double seconds = report.reference_seconds;
  for (const CellResult& r : report.cells) {
    tokens += r.tokens;
    seconds += r.seconds;
  }
  fmt::print(
      "\n{} sessions per cell at concurrency {}, preset {} ({} layers), {} ({}), seed {}: {} "
      "tokens in {:.1f} s ({:.1f} s for the references)\n",
      c.shape.sessions, c.shape.concurrency, c.preset, report.config["layers"].get<int>(),
      o.backend, report.config["device"].get<std::string>(), c.shape.seed, tokens, seconds,
      report.reference_seconds);
  for (const CellResult& r : report.cells) {
    fmt::print("  {}: {:.0f} tokens/s; per engine step: {}\n", r.cell.condition(),
               r.seconds > 0 ? r.tokens / r.seconds : 0.0,
               r.stats.seconds.per_step_us(r.stats.steps).describe_us());
  }
  if (!o.json.empty()) write_result_file(o.json, stress_json(report).dump(2) + "\n", "--json");
  if (!o.plot.empty()) write_result_file(o.plot, stress_svg(report), "--plot");
  const StressVerdict verdict = stress_verdict(report);
  fmt::print("{}\n", verdict.line);
  for (const std::string& p : verdict.problems) fmt::print("  {}\n", p);
  return verdict.exit_code;
}

}  // namespace

void register_stress(CLI::App& app, SubcommandAction& run) {
  auto o = std::make_shared<StressOpts>();
  o->shape.sessions = 0;  // 0: the backend's default
  o->shape.concurrency = 0;
  CLI::App* cmd = app.add_subcommand(
      "stress",
      "concurrent multi-turn sessions across index-K x runner x faults; prints the "
      "incident's table and a verdict line. Exit 0: the fingerprint holds (only bf16 index-K + "
      "graph + incident faults corrupts, and it does when in the matrix) and the detectors agree; "
      "1: it does not, or the auditor missed what the oracle or divergence saw; 2: bad usage; "
      "3: turns failed or a step raised its error flag (lost work)");
  cmd->add_option("--preset", o->preset, "model preset")->capture_default_str();
  add_int_option(cmd, "--layers", o->layers, 0, 256,
                 "layers kept from the preset (0: all), e.g. --preset v32 --layers 2");
  cmd->add_option("--backend", o->backend, "cpu | cuda")->capture_default_str();
  add_mla_splits_option(cmd, o->mla_splits);
  add_mla_kernel_option(cmd, o->mla_kernel);
  cmd->add_option("--index-k", o->index_k, "bf16 | fp8 | all")->capture_default_str();
  cmd->add_option("--mode", o->mode, "eager | graph | all")->capture_default_str();
  cmd->add_option("--faults,--inject", o->faults,
                  "guarded | incident (= stale-padding,unguarded-store) | all")
      ->capture_default_str();
  add_int_option(cmd, "--sessions", o->shape.sessions, 0, 100000,
                 "sessions per cell (0: 12 on cpu, 60 on cuda)");
  add_int_option(cmd, "--concurrency", o->shape.concurrency, 0, 100000,
                 "sessions active at once (0: 8 on cpu, 60 on cuda)");
  add_seed_option(cmd, "--seed", o->shape.seed, "workload seed");
  add_seed_option(cmd, "--weight-seed", o->weight_seed, "synthetic weight seed");
  add_int_option(cmd, "--min-turns", o->shape.min_turns, 1, kMaxStressTurns,
                 "turns per session, least");
  add_int_option(cmd, "--max-turns", o->shape.max_turns, 1, kMaxStressTurns,
                 "turns per session, most");
  add_int_option(cmd, "--min-prompt", o->shape.min_prompt, 1, kMaxStressTokens,
                 "new tokens per turn, least");
  add_int_option(cmd, "--max-prompt", o->shape.max_prompt, 1, kMaxStressTokens,
                 "new tokens per turn, most");
  add_int_option(cmd, "--min-reply", o->shape.min_reply, 1, kMaxStressTokens,
                 "reply tokens per turn, least");
  add_int_option(cmd, "--max-reply", o->shape.max_reply, 1, kMaxStressTokens,
                 "reply tokens per turn, most");
  add_int_option(cmd, "--arrival-gap", o->shape.max_arrival_gap, 0, kMaxStressTokens,
                 "most engine steps between arrivals");
  add_int_option(cmd, "--think", o->shape.max_think, 0, kMaxStressTokens,
                 "most engine steps between a reply and the next turn");
  add_int_option(cmd, "--system-prompt", o->shape.system_prompt, 0, kMaxStressTokens,
                 "tokens of one system prompt opening every session (shared pages for the "
                 "prefix cache)");
  cmd->add_option("--prefix-cache", o->prefix_cache,
                  "cells with the prefix cache: on | off | all (the two prefix-cache cells are "
                  "bf16 index-K + graph, guarded and incident)")
      ->capture_default_str();
  cmd->add_option("--policy", o->policy, "session cache between turns: keep | recompute")
      ->capture_default_str();
  add_int_option(cmd, "--max-rows", o->max_rows, 1, kMaxRowsLimit,
                 "rows per step (prefill chunk, largest bucket)");
  add_int_option(cmd, "--pages", o->pages, 0, kMaxPagesLimit,
                 "pages per pool (0: a third of what the concurrent sessions could need)");
  cmd->add_flag("--allow-slow-cpu", o->allow_slow_cpu,
                "run a workload the scalar CPU backend needs hours for (refused otherwise)");
  cmd->add_option("--audit-scope", o->audit_scope, "auditor verification: all | read | sample")
      ->capture_default_str();
  cmd->add_flag("--no-audit", o->no_audit, "turn the auditor off (detection by divergence only)");
  cmd->add_flag("--no-reference", o->no_reference, "skip the reference comparison");
  cmd->add_option("--json", o->json, "write the results as JSON")->check(non_empty("a file name"));
  cmd->add_option("--plot", o->plot, "write a bar chart as SVG")->check(non_empty("a file name"));
  cmd->add_flag("--quiet", o->quiet, "no progress line");
  cmd->callback([&run, o] { run = [o] { return run_stress_command(*o); }; });
}

}  // namespace dsa::tools
