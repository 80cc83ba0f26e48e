// dsa bench-serve's report: percentiles, the table, JSON, and a latency CDF as SVG.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsa/bench_serve.h"

namespace dsa::bench {

using nlohmann::json;

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double rank = q * double(v.size() - 1);
    const size_t lo = size_t(rank);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
  };
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  p.median = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  return p;
}

namespace {

std::string rate_text(double rate) { return std::isinf(rate) ? "inf" : fmt::format("{:g}", rate); }

json percentiles_json(const Percentiles& p) {
  return {{"mean", p.mean}, {"median", p.median}, {"p90", p.p90}, {"p99", p.p99}};
}

}  // namespace

std::string bench_table(const BenchOptions& o, const BenchReport& r) {
  std::string out;
  auto line = [&](const std::string& name, const std::string& value) {
    out += fmt::format("{:<40}{:>14}\n", name, value);
  };
  auto num = [](double x, int digits = 2) { return fmt::format("{:.{}f}", x, digits); };
  out += fmt::format("{:=^54}\n", " Serving Benchmark Result ");
  line("Workload:", o.sessions > 0 ? fmt::format("{} sessions", o.sessions) : "prompts");
  line("Concurrency:", std::to_string(o.concurrency));
  line("Request rate (req/s):", rate_text(o.request_rate));
  line("Successful requests:", std::to_string(r.completed));
  line("Failed requests:", std::to_string(r.failed));
  if (o.sessions > 0) line("Sessions cut at the context:", std::to_string(r.context_ended));
  line("Benchmark duration (s):", num(r.duration_s));
  line("Total input tokens:", std::to_string(r.input_tokens));
  line("Total generated tokens:", std::to_string(r.output_tokens));
  line("Cached input tokens:", std::to_string(r.cached_tokens));
  line("Prefix cache hit rate:",
       r.input_tokens > 0 ? fmt::format("{:.1f}%", 100.0 * r.prefix_hit_rate) : std::string("-"));
  line("Request throughput (req/s):", num(r.request_throughput));
  line("Output token throughput (tok/s):", num(r.output_throughput));
  line("Total token throughput (tok/s):", num(r.total_token_throughput));
  if (o.slo_ttft_ms > 0 || o.slo_tpot_ms > 0) line("Request goodput (req/s):", num(r.goodput));
  auto block = [&](const char* title, const char* key, const Percentiles& p) {
    out += fmt::format("{:-^54}\n", fmt::format(" {} ", title));
    line(fmt::format("Mean {} (ms):", key), num(p.mean));
    line(fmt::format("Median {} (ms):", key), num(p.median));
    line(fmt::format("P90 {} (ms):", key), num(p.p90));
    line(fmt::format("P99 {} (ms):", key), num(p.p99));
  };
  block("Time to First Token", "TTFT", r.ttft_ms);
  if (o.sessions > 0 && o.max_turns >= 3) {
    line("Median TTFT, turns >= 3 (ms):", num(r.ttft_late_ms.median));
    line("P90 TTFT, turns >= 3 (ms):", num(r.ttft_late_ms.p90));
  }
  block("Time per Output Token (excl. 1st token)", "TPOT", r.tpot_ms);
  block("Inter-token Latency", "ITL", r.itl_ms);
  block("End-to-end Latency", "E2EL", r.e2el_ms);
  out += fmt::format("{:=^54}\n", "");
  if (r.checked) {
    const std::string condition =
        r.fault_injection.empty() ? "guarded server" : "fault injection: " + r.fault_injection;
    const std::string unit = o.sessions > 0 ? "sessions" : "requests";
    out += fmt::format(
        "\n| condition | corrupted {} (k/N, %) | replayed requests |\n|---|---|---|\n", unit);
    const double pct = r.check.sessions ? 100.0 * r.check.corrupted / r.check.sessions : 0.0;
    out += fmt::format("| {} | {}/{} ({:.0f}%) | {} |\n", condition, r.check.corrupted,
                       r.check.sessions, pct, r.check.replayed_requests);
  }
  return out;
}

json bench_json(const BenchOptions& o, const BenchReport& r) {
  json j = {{"url", o.url},
            {"concurrency", o.concurrency},
            {"request_rate", std::isinf(o.request_rate) ? json("inf") : json(o.request_rate)},
            {"sessions", o.sessions},
            {"turns", {o.min_turns, o.max_turns}},
            {"num_prompts", o.sessions > 0 ? json(nullptr) : json(o.num_prompts)},
            {"input_len", o.input_len},
            {"output_len", o.output_len},
            {"temperature", o.temperature},
            {"seed", o.seed},
            {"duration_s", r.duration_s},
            {"completed", r.completed},
            {"failed", r.failed},
            {"sessions_cut_at_context", r.context_ended},
            {"tools", o.tools},
            {"total_input_tokens", r.input_tokens},
            {"total_output_tokens", r.output_tokens},
            {"total_cached_tokens", r.cached_tokens},
            {"prefix_cache_hit_rate", r.prefix_hit_rate},
            {"request_throughput", r.request_throughput},
            {"output_throughput", r.output_throughput},
            {"total_token_throughput", r.total_token_throughput},
            {"ttft_ms", percentiles_json(r.ttft_ms)},
            {"ttft_turn3plus_ms", percentiles_json(r.ttft_late_ms)},
            {"tpot_ms", percentiles_json(r.tpot_ms)},
            {"itl_ms", percentiles_json(r.itl_ms)},
            {"e2el_ms", percentiles_json(r.e2el_ms)},
            {"fault_injection", r.fault_injection}};
  if (o.slo_ttft_ms > 0 || o.slo_tpot_ms > 0) {
    j["goodput"] = r.goodput;
    j["slo_ttft_ms"] = o.slo_ttft_ms;
    j["slo_tpot_ms"] = o.slo_tpot_ms;
  }
  if (r.checked) {
    j["check"] = {{"units", o.sessions > 0 ? "sessions" : "requests"},
                  {"total", r.check.sessions},
                  {"corrupted", r.check.corrupted},
                  {"replayed_requests", r.check.replayed_requests},
                  {"first_divergent_turns", r.check.first_divergent_turns}};
  }
  return j;
}

std::string bench_cdf_svg(const BenchReport& r) {
  std::vector<double> ttft, e2el;
  for (const RequestRecord& x : r.records) {
    if (!x.ok) continue;
    ttft.push_back(x.ttft_s * 1e3);
    e2el.push_back(x.e2el_s * 1e3);
  }
  std::sort(ttft.begin(), ttft.end());
  std::sort(e2el.begin(), e2el.end());
  const double w = 640, h = 400, left = 60, right = 20, top = 30, bottom = 50;
  const double xmax = std::max(1.0, e2el.empty() ? 1.0 : e2el.back()) * 1.05;
  auto px = [&](double ms) { return left + (w - left - right) * ms / xmax; };
  auto py = [&](double q) { return h - bottom - (h - top - bottom) * q; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"{}\" y=\"18\" font-size=\"14\">Latency CDF ({} "
      "requests)</text>\n",
      w, h, left, ttft.size());
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", left,
                   py(0), w - right, py(0));
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", left,
                   py(0), left, py(1));
  for (int i = 0; i <= 4; ++i) {
    const double q = i / 4.0, ms = xmax * i / 4.0;
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.2f}</text>\n", left - 6,
                     py(q) + 4, q);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", px(ms),
                     py(0) + 18, ms);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">latency (ms)</text>\n",
                   (left + w - right) / 2, h - 10);
  auto curve = [&](const std::vector<double>& v, const char* color, const char* name, int row) {
    std::string points;
    for (size_t i = 0; i < v.size(); ++i) {
      points += fmt::format("{:.1f},{:.1f} ", px(v[i]), py(double(i + 1) / double(v.size())));
    }
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                     color, points);
    s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", w - right - 120,
                     py(0.2) + 16 * row, color, name);
  };
  curve(ttft, "#1f77b4", "TTFT", 0);
  curve(e2el, "#d62728", "E2E latency", 1);
  s += "</svg>\n";
  return s;
}

}  // namespace dsa::bench
