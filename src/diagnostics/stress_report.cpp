// dsa stress's outputs: the incident's table, the JSON record and an SVG bar chart.
#include <fmt/format.h>

#include <algorithm>

#include "dsa/stress.h"

namespace dsa {
namespace {

double percent(int k, int n) { return n > 0 ? 100.0 * k / n : 0.0; }

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '&') {
      out += "&amp;";
    } else if (ch == '<') {
      out += "&lt;";
    } else if (ch == '>') {
      out += "&gt;";
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

std::string stress_table(const StressReport& report) {
  std::string out =
      "| condition | corrupted sessions (k/N, %) | auditor flagged | diverged | flagged and "
      "diverged | diverged not flagged | oracle clobbers / auditor found | failed turns |\n"
      "|---|---|---|---|---|---|---|---|\n";
  for (const CellResult& c : report.cells) {
    const std::string oracle =
        c.oracle ? fmt::format("{} / {}", c.oracle_clobbers, c.auditor_found) : "-";
    out += fmt::format("| {} | {}/{} ({:.0f}%) | {} | {} | {} | {} | {} | {} |\n",
                       c.cell.condition(), c.corrupted, c.sessions,
                       percent(c.corrupted, c.sessions), c.auditor_flagged, c.diverged,
                       c.flagged_and_diverged, c.diverged_not_flagged, oracle, c.failed_turns);
  }
  std::string radius;
  for (const CellResult& c : report.cells) {
    if (c.clobbered_slots == 0) continue;
    radius += fmt::format("  {}: {} clobbered slots, {:.2f} sessions named per slot\n",
                          c.cell.condition(), c.clobbered_slots, c.sessions_per_clobbered_slot);
  }
  if (!radius.empty()) out += "\nblast radius (auditor findings):\n" + radius;
  return out;
}

nlohmann::json stress_json(const StressReport& report) {
  nlohmann::json cells = nlohmann::json::array();
  for (const CellResult& c : report.cells) {
    const EngineStats& s = c.stats;
    const StepTimes us = s.seconds.per_step_us(s.steps);
    cells.push_back({{"index_k", kv_dtype_name(c.cell.index_k)},
                     {"runner", c.cell.runner == RunMode::kGraph ? "graph" : "eager"},
                     {"faults", c.cell.faults},
                     {"prefix_cache", c.cell.prefix_cache},
                     {"clobbered_slots", c.clobbered_slots},
                     {"sessions_per_clobbered_slot", c.sessions_per_clobbered_slot},
                     {"prefix_cache_queries", s.prefix_cache_queries},
                     {"prefix_cache_hits", s.prefix_cache_hits},
                     {"prefix_cache_evictions", s.prefix_cache_evictions},
                     {"condition", c.cell.condition()},
                     {"sessions", c.sessions},
                     {"corrupted", c.corrupted},
                     {"corrupted_percent", percent(c.corrupted, c.sessions)},
                     {"auditor_flagged", c.auditor_flagged},
                     {"diverged", c.diverged},
                     {"flagged_and_diverged", c.flagged_and_diverged},
                     {"diverged_not_flagged", c.diverged_not_flagged},
                     {"failed_turns", c.failed_turns},
                     {"failed_sessions", c.failed_sessions},
                     {"oracle", c.oracle},
                     {"oracle_clobbers", c.oracle_clobbers},
                     {"auditor_found", c.auditor_found},
                     {"auditor_unconfirmed", c.auditor_unconfirmed},
                     {"first_divergent_turns", c.first_divergent_turns},
                     {"audit_findings", c.audit_findings},
                     {"tokens", c.tokens},
                     {"seconds", c.seconds},
                     {"tokens_per_second", c.seconds > 0 ? c.tokens / c.seconds : 0.0},
                     {"engine_steps", s.steps},
                     {"decode_steps", s.decode_steps},
                     {"decode_rows", s.decode_rows},
                     {"prefill_rows", s.prefill_rows},
                     {"padded_rows", s.padded_rows},
                     {"preemptions", s.preemptions},
                     {"evicted_sessions", s.evicted_sessions},
                     {"store_errors", s.store_errors},
                     {"engine_host_us_per_step", us.host()},
                     {"schedule_us_per_step", us.schedule},
                     {"stage_us_per_step", us.stage},
                     {"post_us_per_step", us.post},
                     {"launch_us_per_step", us.launch},
                     {"device_wait_us_per_step", us.device_wait},
                     {"audit_us_per_step", us.audit}});
  }
  const StressVerdict verdict = stress_verdict(report);
  return {{"cells", cells},
          {"config", report.config},
          {"reference_seconds", report.reference_seconds},
          {"guarded_clean", report.guarded_clean()},
          {"verdict", verdict.line},
          {"problems", verdict.problems},
          {"exit_code", verdict.exit_code}};
}

std::string stress_svg(const StressReport& report) {
  // One bar per cell: corrupted sessions in percent; faulty cells drawn in red, guarded in grey.
  const int bar = 56, gap = 24, left = 60, top = 40, height = 240, label = 150;
  const int n = int(report.cells.size());
  const int width = left + n * (bar + gap) + gap + label;  // room for the last slanted label
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"20\" font-size=\"14\">dsa stress: corrupted sessions per condition "
      "({} sessions per cell)</text>\n",
      width, top + height + label, left, n > 0 ? report.cells[0].sessions : 0);
  for (int pct = 0; pct <= 100; pct += 25) {
    const int y = top + height - height * pct / 100;
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#ddd\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}%</text>\n",
        left, y, width - label, y, left - 6, y + 4, pct);
  }
  for (int i = 0; i < n; ++i) {
    const CellResult& c = report.cells[size_t(i)];
    const double p = percent(c.corrupted, c.sessions);
    const int h = std::max(1, int(height * p / 100.0));
    const int x = left + gap + i * (bar + gap);
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", x,
                       top + height - h, bar, h, c.cell.faults ? "#c0392b" : "#7f8c8d");
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}/{}</text>\n", x + bar / 2,
                       top + height - h - 4, c.corrupted, c.sessions);
    svg += fmt::format("<text transform=\"translate({},{}) rotate(40)\">{}</text>\n", x + 8,
                       top + height + 14, xml_escape(c.cell.condition()));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace dsa
