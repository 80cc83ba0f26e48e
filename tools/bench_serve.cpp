// dsa bench-serve: the client-side load generator (src/server/bench_*.cpp).
#include "dsa/bench_serve.h"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <limits>

#include "common.h"
#include "dsa/error.h"

namespace dsa::tools {
namespace {

struct BenchServeOpts {
  bench::BenchOptions bench;
  std::string turns = "2..4", rate = "inf", json, plot;
  bool quiet = false;
};

void parse_turns(const std::string& s, bench::BenchOptions& o) {
  const size_t dots = s.find("..");
  try {
    if (dots == std::string::npos) {
      o.min_turns = o.max_turns = std::stoi(s);
    } else {
      o.min_turns = std::stoi(s.substr(0, dots));
      o.max_turns = std::stoi(s.substr(dots + 2));
    }
  } catch (const std::exception&) {
    fail(ErrorCode::kInvalidArgument, "--turns must be N or A..B, got '{}'", s);
  }
}

double parse_rate(const std::string& s) {
  if (s == "inf") return std::numeric_limits<double>::infinity();
  try {
    size_t used = 0;
    const double r = std::stod(s, &used);
    if (used == s.size()) return r;
  } catch (const std::exception&) {
  }
  fail(ErrorCode::kInvalidArgument, "--request-rate must be a number or inf, got '{}'", s);
}

int run_bench_serve(BenchServeOpts& o) {
  parse_turns(o.turns, o.bench);
  o.bench.request_rate = parse_rate(o.rate);
  bench::ProgressFn progress;
  if (!o.quiet) {
    progress = [](int done, int total, const char* phase) {
      const int width = 40;
      const int filled = total > 0 ? std::min(width, done * width / total) : 0;
      fmt::print(stderr, "\r{:<8} [{}{}] {}/{}", phase, std::string(size_t(filled), '#'),
                 std::string(size_t(width - filled), '.'), done, total);
      std::fflush(stderr);
    };
  }
  const bench::BenchReport report = bench::run_bench(o.bench, progress);
  if (!o.quiet) fmt::print(stderr, "\r{:<80}\r", "");
  fmt::print("{}", bench::bench_table(o.bench, report));
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    require(bool(out), ErrorCode::kIo, "cannot write --json file '{}'", o.json);
    out << bench::bench_json(o.bench, report).dump(2) << "\n";
  }
  if (!o.plot.empty()) {
    std::ofstream out(o.plot);
    require(bool(out), ErrorCode::kIo, "cannot write --plot file '{}'", o.plot);
    out << bench::bench_cdf_svg(report);
  }
  if (report.checked && report.check.corrupted > 0) {
    fmt::print(stderr, "dsa bench-serve: CORRUPTION FOUND: {} of {} replays differ\n",
               report.check.corrupted, report.check.sessions);
    return 1;
  }
  return 0;
}

}  // namespace

void register_bench_serve(CLI::App& app, SubcommandAction& run) {
  auto o = std::make_shared<BenchServeOpts>();
  bench::BenchOptions& b = o->bench;
  CLI::App* cmd = app.add_subcommand(
      "bench-serve",
      "load generator against a dsa serve (or any OpenAI-compatible) server: throughput, TTFT, "
      "TPOT, ITL, E2EL; --check replays every session alone (exit 1 when one differs)");
  cmd->add_option("--url", b.url, "server address")->capture_default_str();
  cmd->add_option("--api-key", b.api_key, "sent as 'Authorization: Bearer KEY'");
  cmd->add_option("--model", b.model, "model id (default: the first /v1/models lists)");
  cmd->add_option("--concurrency", b.concurrency, "requests (or sessions) in flight at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--num-prompts", b.num_prompts, "plain completions to send")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  cmd->add_option("--request-rate", o->rate, "arrivals per second, Poisson (inf: all at once)")
      ->capture_default_str();
  cmd->add_option("--input-len", b.input_len, "words per prompt or per new message")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--prompt-ids", b.prompt_ids,
                "plain prompts as --input-len random token ids (exact lengths)");
  cmd->add_option("--output-len", b.output_len, "max_tokens per request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--range-ratio", b.range_ratio, "lengths drawn from len * [1 - r, 1 + r]")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--sessions", b.sessions, "agent sessions (multi-turn chat with tools)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_flag("!--no-tools", b.tools,
                "sessions: send no tool definitions (short prompts for small-context models)");
  cmd->add_option("--turns", o->turns, "turns per session: N or A..B")->capture_default_str();
  cmd->add_option("--temperature", b.temperature, "0: greedy; > 0: seeded sampling")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_flag("!--no-ignore-eos", b.ignore_eos, "stop at the end-of-sentence token");
  cmd->add_option("--seed", b.seed, "workload seed")->capture_default_str();
  cmd->add_option("--slo-ttft", b.slo_ttft_ms, "goodput: TTFT bound in ms")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--slo-tpot", b.slo_tpot_ms, "goodput: TPOT bound in ms")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--check", b.check, "replay every request alone and count differing sessions");
  cmd->add_option("--check-url", b.check_url, "replay against this server instead");
  cmd->add_option("--timeout", b.timeout_s, "seconds per request")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--wait-ready", b.wait_ready_s,
                  "first wait up to this many seconds for the servers' /health to answer 200")
      ->check(CLI::Range(0, 86400));
  cmd->add_option("--json", o->json, "write the results as JSON");
  cmd->add_option("--plot", o->plot, "write the latency CDF as SVG");
  cmd->add_flag("--quiet", o->quiet, "no progress bar");
  cmd->callback([&run, o] { run = [o] { return run_bench_serve(*o); }; });
}

}  // namespace dsa::tools
