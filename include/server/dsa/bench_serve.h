// dsa bench-serve: a load generator that speaks the server's HTTP API, never the engine. It sends
// plain completions (random prompts, Poisson or unthrottled arrivals) or multi-turn agent sessions
// (each turn: the whole history plus tools; the reply, content or tool calls, joins the history
// with a synthetic tool result or a user message; and on), all streamed, and reports what vLLM's
// and SGLang's bench_serving report: throughput, TTFT, TPOT, ITL and E2EL percentiles, goodput.
//
// --check replays every request alone (concurrency 1), on the same server or another one, with the
// very bodies the concurrent run sent: a session whose reply to any turn differs is corrupted.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsa::bench {

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string model;  // empty: the first model /v1/models lists
  int concurrency = 16;
  int num_prompts = 100;                                          // plain mode
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s, Poisson
  int input_len = 128;      // words per prompt (plain) or per user/tool message (sessions)
  bool prompt_ids = false;  // plain prompts as input_len random token ids in [3, 259) instead
  int output_len = 64;      // max_tokens per request
  bool tools = true;        // sessions: send the two agent tools with every turn
  double range_ratio = 0;   // lengths drawn from [len * (1 - r), len * (1 + r)]
  int sessions = 0;         // > 0: agent sessions instead of plain prompts
  int min_turns = 2, max_turns = 4;
  double temperature = 0;  // > 0: seeded sampling (seed from the workload seed, session, turn)
  bool ignore_eos = true;  // generate exactly max_tokens (as vLLM's random dataset does)
  uint64_t seed = 1;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;  // goodput: requests within both (0: no bound)
  bool check = false;
  std::string check_url;  // empty: the same server
  int timeout_s = 600;    // per request
  int wait_ready_s = 0;   // first wait up to this long for GET /health to answer 200
};

// One request as the client saw it.
struct RequestRecord {
  bool ok = false;
  std::string error;
  int status = 0;
  int session = -1, turn = -1;
  int prompt_tokens = 0, output_tokens = 0;
  int cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens (the prefix cache)
  double start_s = 0;     // since the benchmark's start
  double ttft_s = 0;      // to the first chunk with generated text
  double e2el_s = 0;
  std::vector<double> itl_s;    // between chunks with generated text
  std::string reply;            // content, reasoning and tool calls, canonical (for --check)
  nlohmann::json message;       // the assistant message (sessions)
  std::string body;             // the request body sent (kept for --check)
  std::string fault_injection;  // the server's X-Dsa-Fault-Injection header, if any
};

struct Percentiles {
  double mean = 0, median = 0, p90 = 0, p99 = 0;
};

struct CheckResult {
  int sessions = 0;   // sessions (or plain requests) replayed
  int corrupted = 0;  // whose replay differs at some turn
  int replayed_requests = 0;
  std::vector<int> first_divergent_turns;
};

struct BenchReport {
  std::vector<RequestRecord> records;
  double duration_s = 0;
  int completed = 0, failed = 0;
  int context_ended = 0;  // sessions that ended early because the next turn passed the context
  int64_t input_tokens = 0, output_tokens = 0;
  int64_t cached_tokens = 0;   // input tokens the server found in its prefix cache
  double prefix_hit_rate = 0;  // cached_tokens / input_tokens (0 without input)
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  double goodput = 0;  // requests/s within the SLOs (only with an SLO)
  Percentiles ttft_ms, tpot_ms, itl_ms, e2el_ms;
  Percentiles ttft_late_ms;  // sessions: TTFT of turns >= 3 (1-based), where history dominates
  std::string fault_injection;
  bool checked = false;
  CheckResult check;
};

using ProgressFn = std::function<void(int done, int total, const char* phase)>;

// Runs the benchmark. Throws dsa::Error (kInvalidArgument) on bad options and kIo when the
// server cannot be reached at the start.
BenchReport run_bench(const BenchOptions& options, const ProgressFn& progress = {});

std::string bench_table(const BenchOptions& options, const BenchReport& report);
nlohmann::json bench_json(const BenchOptions& options, const BenchReport& report);
std::string bench_cdf_svg(const BenchReport& report);  // TTFT and E2EL latency CDFs

// Percentiles by linear interpolation between closest ranks (numpy's default).
Percentiles percentiles(std::vector<double> values);

}  // namespace dsa::bench
