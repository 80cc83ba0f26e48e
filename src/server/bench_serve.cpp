// dsa bench-serve: the workloads (plain prompts, agent sessions), the concurrent driver, and the
// --check replay.
#include "dsa/bench_serve.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include "dsa/error.h"
#include "server/bench_http.h"

namespace dsa::bench {
namespace {

using nlohmann::json;

// Common words: random prompts that read as text and tokenize to about one token a word.
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",  "it",    "as",
    "was",   "with",  "be",    "by",    "on",    "not",   "he",    "this", "are",   "or",
    "his",   "from",  "at",    "which", "but",   "have",  "an",    "had",  "they",  "you",
    "were",  "their", "one",   "all",   "we",    "can",   "her",   "has",  "there", "been",
    "if",    "more",  "when",  "will",  "would", "who",   "so",    "no",   "file",  "run",
    "data",  "cache", "page",  "slot",  "token", "model", "state", "read", "write", "list",
    "value", "error", "check", "table", "index", "query", "time",  "step", "batch", "graph"};

std::string random_words(std::mt19937_64& rng, int n) {
  std::string s;
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

int draw_len(std::mt19937_64& rng, int len, double ratio) {
  const int lo = std::max(1, int(std::floor(len * (1 - ratio))));
  const int hi = std::max(lo, int(std::ceil(len * (1 + ratio))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

json sampling_fields(const BenchOptions& o, uint64_t seed, int max_tokens) {
  json j = {{"max_tokens", max_tokens},
            {"temperature", o.temperature},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
  if (o.temperature > 0) j["seed"] = seed;
  if (o.ignore_eos) j["ignore_eos"] = true;
  return j;
}

json agent_tools() {
  auto tool = [](const char* name, const char* description, const char* param) {
    return json{{"type", "function"},
                {"function",
                 {{"name", name},
                  {"description", description},
                  {"parameters",
                   {{"type", "object"},
                    {"properties", {{param, {{"type", "string"}}}}},
                    {"required", json::array({param})}}}}}};
  };
  return json::array({tool("read_file", "Read a file of the workspace.", "path"),
                      tool("run_shell", "Run a shell command and return its output.", "command")});
}

void validate(const BenchOptions& o) {
  require(o.concurrency >= 1, ErrorCode::kInvalidArgument, "--concurrency must be >= 1, got {}",
          o.concurrency);
  require(o.sessions > 0 || o.num_prompts >= 1, ErrorCode::kInvalidArgument,
          "--num-prompts must be >= 1, got {}", o.num_prompts);
  require(o.sessions >= 0, ErrorCode::kInvalidArgument, "--sessions must be >= 0, got {}",
          o.sessions);
  require(o.min_turns >= 1 && o.min_turns <= o.max_turns, ErrorCode::kInvalidArgument,
          "--turns {}..{} must satisfy 1 <= a <= b", o.min_turns, o.max_turns);
  require(o.input_len >= 1 && o.output_len >= 1, ErrorCode::kInvalidArgument,
          "--input-len {} and --output-len {} must be >= 1", o.input_len, o.output_len);
  require(o.range_ratio >= 0 && o.range_ratio < 1, ErrorCode::kInvalidArgument,
          "--range-ratio must be in [0, 1), got {}", o.range_ratio);
  require(o.request_rate > 0, ErrorCode::kInvalidArgument,
          "--request-rate must be > 0 (inf: no throttle), got {}", o.request_rate);
  require(o.temperature >= 0 && o.temperature <= 2, ErrorCode::kInvalidArgument,
          "--temperature must be in [0, 2], got {}", o.temperature);
}

// Start times (seconds) of n arrivals: all at 0 for an infinite rate, else a Poisson process.
std::vector<double> arrivals(int n, double rate, uint64_t seed) {
  std::vector<double> t(size_t(n), 0.0);
  if (std::isinf(rate)) return t;
  std::mt19937_64 rng(mix(seed, 0xA77));
  std::exponential_distribution<double> gap(rate);
  double clock = 0;
  for (double& x : t) {
    clock += gap(rng);
    x = clock;
  }
  return t;
}

bool context_exhausted(const RequestRecord& r) {
  return r.status == 400 && r.error.find("context") != std::string::npos;
}

struct Driver {
  const BenchOptions& o;
  Endpoint endpoint;
  std::string model;
  BenchClock::time_point t0;
  const ProgressFn& progress;
  std::mutex mu;
  std::vector<RequestRecord> records;
  std::atomic<int> done{0};
  std::atomic<int> context_ended{0};
  int total = 0;

  void finished(RequestRecord r) {
    std::lock_guard lock(mu);
    records.push_back(std::move(r));
    if (progress) progress(++done, total, "requests");
  }

  void plain_request(int i) {
    std::mt19937_64 rng(mix(o.seed, uint64_t(i)));
    json body = sampling_fields(o, mix(o.seed, uint64_t(i) + 1),
                                draw_len(rng, o.output_len, o.range_ratio));
    body["model"] = model;
    const int len = draw_len(rng, o.input_len, o.range_ratio);
    if (o.prompt_ids) {  // exact lengths, as a direct engine benchmark submits them
      std::vector<int> ids(size_t(len), 0);
      for (int& id : ids) id = std::uniform_int_distribution<int>(3, 258)(rng);
      body["prompt"] = ids;
    } else {
      body["prompt"] = random_words(rng, len);
    }
    RequestRecord r;
    r.session = i;
    r.turn = 0;
    r.body = body.dump();
    stream_request(endpoint, "/v1/completions", o.api_key, o.timeout_s, t0, r);
    finished(std::move(r));
  }

  void session(int s) {
    std::mt19937_64 rng(mix(o.seed, uint64_t(s) + 0x5E55));
    const int turns = std::uniform_int_distribution<int>(o.min_turns, o.max_turns)(rng);
    json messages = json::array(
        {{{"role", "system"},
          {"content", "You are a coding agent. Call the tools to inspect the workspace."}},
         {{"role", "user"},
          {"content", random_words(rng, draw_len(rng, o.input_len, o.range_ratio))}}});
    for (int t = 0; t < turns; ++t) {
      json body = sampling_fields(o, mix(mix(o.seed, uint64_t(s)), uint64_t(t)),
                                  draw_len(rng, o.output_len, o.range_ratio));
      body["model"] = model;
      body["messages"] = messages;
      if (o.tools) body["tools"] = agent_tools();
      RequestRecord r;
      r.session = s;
      r.turn = t;
      r.body = body.dump();
      stream_request(endpoint, "/v1/chat/completions", o.api_key, o.timeout_s, t0, r);
      if (context_exhausted(r)) {  // the conversation reached the model's context: it ends here
        ++context_ended;
        if (progress) progress(done, total, "requests");
        break;
      }
      const bool ok = r.ok;
      const json message = r.message;
      finished(std::move(r));
      if (!ok) break;
      messages.push_back(message);
      if (message.contains("tool_calls")) {
        for (const json& call : message["tool_calls"]) {
          messages.push_back(
              {{"role", "tool"},
               {"tool_call_id", call.value("id", "")},
               {"content", random_words(rng, draw_len(rng, o.input_len, o.range_ratio))}});
        }
      } else {
        messages.push_back(
            {{"role", "user"},
             {"content", random_words(rng, draw_len(rng, o.input_len, o.range_ratio))}});
      }
    }
  }

  // Runs n units (requests or sessions) on `concurrency` threads, starting each at its arrival.
  void run_units(int n, const std::function<void(int)>& unit) {
    const std::vector<double> start = arrivals(n, o.request_rate, o.seed);
    std::atomic<int> next{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < std::min(o.concurrency, n); ++w) {
      workers.emplace_back([&] {
        for (int i; (i = next.fetch_add(1)) < n;) {
          std::this_thread::sleep_until(t0 + std::chrono::duration_cast<BenchClock::duration>(
                                                 std::chrono::duration<double>(start[size_t(i)])));
          unit(i);
        }
      });
    }
    for (std::thread& t : workers) t.join();
  }
};

// Replays every recorded body alone, in order, and compares the replies.
CheckResult check_replay(const BenchOptions& o, std::vector<RequestRecord>& records,
                         const ProgressFn& progress) {
  const Endpoint endpoint = parse_url(o.check_url.empty() ? o.url : o.check_url);
  std::sort(records.begin(), records.end(), [](const RequestRecord& a, const RequestRecord& b) {
    return std::tie(a.session, a.turn) < std::tie(b.session, b.turn);
  });
  CheckResult c;
  const BenchClock::time_point t0 = BenchClock::now();
  int done = 0, current = -1, divergent_turn = -1;
  auto close_session = [&] {
    if (current < 0) return;
    ++c.sessions;
    if (divergent_turn >= 0) {
      ++c.corrupted;
      c.first_divergent_turns.push_back(divergent_turn);
    }
  };
  for (const RequestRecord& r : records) {
    if (r.session != current) {
      close_session();
      current = r.session;
      divergent_turn = -1;
    }
    if (progress) progress(++done, int(records.size()), "check");
    if (!r.ok || divergent_turn >= 0) continue;  // one divergent turn marks the session
    RequestRecord replay;
    replay.body = r.body;
    stream_request(endpoint,
                   r.body.find("\"messages\"") != std::string::npos ? "/v1/chat/completions"
                                                                    : "/v1/completions",
                   o.api_key, o.timeout_s, t0, replay);
    ++c.replayed_requests;
    if (!replay.ok || replay.reply != r.reply) divergent_turn = r.turn;
  }
  close_session();
  return c;
}

}  // namespace

BenchReport run_bench(const BenchOptions& o, const ProgressFn& progress) {
  validate(o);
  Driver d{o, parse_url(o.url), o.model, BenchClock::now(), progress, {}, {}, {}, 0};
  if (!o.check_url.empty()) parse_url(o.check_url);
  for (const std::string& url : {o.url, o.check_url}) {  // servers still loading their model
    if (url.empty() || o.wait_ready_s <= 0) continue;
    const BenchClock::time_point deadline =
        BenchClock::now() + std::chrono::seconds(o.wait_ready_s);
    while (http_get(parse_url(url), "/health", "").first != 200) {
      require(BenchClock::now() < deadline, ErrorCode::kIo,
              "{}/health did not answer 200 within {} s", url, o.wait_ready_s);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  const auto [status, body] = http_get(d.endpoint, "/v1/models", o.api_key);
  require(status == 200, ErrorCode::kIo, "cannot list models at {}/v1/models: {} {}",
          d.endpoint.base, status, body);
  if (d.model.empty()) {
    const json models = json::parse(body, nullptr, false);
    require(!models.is_discarded() && models.contains("data") && !models["data"].empty(),
            ErrorCode::kIo, "{}/v1/models lists no model", d.endpoint.base);
    d.model = models["data"][0].value("id", "");
  }

  d.t0 = BenchClock::now();
  if (o.sessions > 0) {
    d.total = o.sessions * (o.min_turns + o.max_turns) / 2;
    d.run_units(o.sessions, [&](int s) { d.session(s); });
  } else {
    d.total = o.num_prompts;
    d.run_units(o.num_prompts, [&](int i) { d.plain_request(i); });
  }
  BenchReport rep;
  rep.duration_s = std::chrono::duration<double>(BenchClock::now() - d.t0).count();
  rep.records = std::move(d.records);
  rep.context_ended = d.context_ended.load();

  std::vector<double> ttft, tpot, itl, e2el, ttft_late;
  int good = 0;
  for (const RequestRecord& r : rep.records) {
    if (!r.fault_injection.empty()) rep.fault_injection = r.fault_injection;
    if (!r.ok) {
      ++rep.failed;
      continue;
    }
    ++rep.completed;
    rep.input_tokens += r.prompt_tokens;
    rep.output_tokens += r.output_tokens;
    rep.cached_tokens += r.cached_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    if (o.sessions > 0 && r.turn >= 2) ttft_late.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.e2el_s * 1e3);
    for (double x : r.itl_s) itl.push_back(x * 1e3);
    const double r_tpot =
        r.output_tokens > 1 ? (r.e2el_s - r.ttft_s) * 1e3 / (r.output_tokens - 1) : 0.0;
    if (r.output_tokens > 1) tpot.push_back(r_tpot);
    good += (o.slo_ttft_ms <= 0 || r.ttft_s * 1e3 <= o.slo_ttft_ms) &&
            (o.slo_tpot_ms <= 0 || r_tpot <= o.slo_tpot_ms);
  }
  const double s = std::max(rep.duration_s, 1e-9);
  rep.request_throughput = rep.completed / s;
  rep.output_throughput = double(rep.output_tokens) / s;
  rep.total_token_throughput = double(rep.input_tokens + rep.output_tokens) / s;
  rep.goodput = good / s;
  rep.ttft_ms = percentiles(ttft);
  rep.ttft_late_ms = percentiles(ttft_late);
  rep.prefix_hit_rate =
      rep.input_tokens > 0 ? double(rep.cached_tokens) / double(rep.input_tokens) : 0.0;
  rep.tpot_ms = percentiles(tpot);
  rep.itl_ms = percentiles(itl);
  rep.e2el_ms = percentiles(e2el);
  if (o.check) {
    rep.checked = true;
    rep.check = check_replay(o, rep.records, progress);
  }
  return rep;
}

}  // namespace dsa::bench
