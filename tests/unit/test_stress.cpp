// dsa stress on a small CPU configuration: the incident's fingerprint (only bf16 index-K with
// graph replay and the faults corrupts), counted by the detectors and by nothing else.
#include <gtest/gtest.h>

#include <string>

#include "dsa/error.h"
#include "dsa/stress.h"

namespace dsa {
namespace {

// Eight short sessions at concurrency six: contexts of up to ~190 tokens, well past the tiny
// preset's index_topk of 32, in a pool that runs full.
StressConfig small_config() {
  StressConfig c;
  c.shape.sessions = 8;
  c.shape.concurrency = 6;
  c.shape.min_turns = 2;
  c.shape.max_turns = 3;
  c.shape.min_prompt = 16;
  c.shape.max_prompt = 48;
  c.shape.min_reply = 8;
  c.shape.max_reply = 16;
  c.shape.seed = 1;
  return c;
}

StressCell incident_cell() { return {KvDtype::kBf16, RunMode::kGraph, true}; }

const CellResult& find(const StressReport& r, const StressCell& cell) {
  for (const CellResult& c : r.cells) {
    if (c.cell.index_k == cell.index_k && c.cell.runner == cell.runner &&
        c.cell.faults == cell.faults && c.cell.prefix_cache == cell.prefix_cache) {
      return c;
    }
  }
  throw std::runtime_error("cell missing: " + cell.condition());
}

TEST(Stress, SmallCpuMatrixShowsTheIncidentsFingerprint) {
  int progress_calls = 0;
  const StressReport report =
      run_stress(small_config(), [&](const StressProgress&) { ++progress_calls; });
  ASSERT_EQ(report.cells.size(), 10u);
  EXPECT_GT(progress_calls, 0);
  for (const CellResult& c : report.cells) {
    SCOPED_TRACE(c.cell.condition());
    EXPECT_EQ(c.sessions, 8);
    EXPECT_GT(c.tokens, 0);
    const bool incident = c.cell.index_k == KvDtype::kBf16 && c.cell.runner == RunMode::kGraph &&
                          c.cell.faults && !c.cell.prefix_cache;
    if (c.cell.prefix_cache) EXPECT_GT(c.stats.prefix_cache_queries, 0);
    if (c.cell.prefix_cache && c.cell.faults) {
      // A finding, not a verdict: whatever it corrupts, the detectors must agree on it.
      EXPECT_EQ(c.auditor_found, c.oracle_clobbers);
    } else if (incident) {
      EXPECT_GT(c.corrupted, 0);
      EXPECT_GT(c.auditor_flagged, 0);
      EXPECT_GT(c.diverged, 0);
      EXPECT_EQ(int(c.first_divergent_turns.size()), c.diverged);
      EXPECT_GT(c.stats.padded_rows, 0);
    } else {
      EXPECT_EQ(c.corrupted, 0);
      EXPECT_EQ(c.auditor_flagged, 0);
      EXPECT_EQ(c.diverged, 0);
      EXPECT_EQ(c.audit_findings, 0);
    }
    EXPECT_LE(c.corrupted, c.auditor_flagged + c.diverged);
    EXPECT_GE(c.corrupted, std::max(c.auditor_flagged, c.diverged));
  }
  // The default pool runs full: pages change hands through eviction and preemption.
  const CellResult& guarded_graph = find(report, {KvDtype::kBf16, RunMode::kGraph, false});
  EXPECT_GT(guarded_graph.stats.preemptions + guarded_graph.stats.evicted_sessions, 0);
  EXPECT_TRUE(report.guarded_clean());

  const nlohmann::json j = stress_json(report);
  ASSERT_EQ(j["cells"].size(), 10u);
  for (const char* key : {"index_k", "runner", "faults", "sessions", "corrupted", "auditor_flagged",
                          "diverged", "first_divergent_turns", "tokens", "seconds"}) {
    EXPECT_TRUE(j["cells"][0].contains(key)) << key;
  }
  EXPECT_EQ(j["config"]["sessions"], 8);
  EXPECT_EQ(j["config"]["concurrency"], 6);
  const std::string table = stress_table(report);
  EXPECT_NE(table.find("| condition | corrupted sessions (k/N, %) | auditor flagged | diverged |"),
            std::string::npos);
  EXPECT_NE(table.find("| bf16 index-K + eager + guarded | 0/8 (0%) | 0 | 0 |"), std::string::npos);
  const std::string svg = stress_svg(report);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Stress, CountsComeFromTheDetectorsAlone) {
  StressConfig c = small_config();
  c.cells = {incident_cell()};

  c.audit = false;
  c.compare_reference = false;
  const CellResult blind = run_stress(c).cells.at(0);
  EXPECT_EQ(blind.corrupted, 0);  // with no detector, nothing is counted
  EXPECT_EQ(blind.auditor_flagged, 0);
  EXPECT_EQ(blind.diverged, 0);

  c.audit = true;
  const CellResult audited = run_stress(c).cells.at(0);
  EXPECT_GT(audited.auditor_flagged, 0);
  EXPECT_EQ(audited.diverged, 0);
  EXPECT_EQ(audited.corrupted, audited.auditor_flagged);

  c.audit = false;
  c.compare_reference = true;
  const CellResult compared = run_stress(c).cells.at(0);
  EXPECT_GT(compared.diverged, 0);
  EXPECT_EQ(compared.auditor_flagged, 0);
  EXPECT_EQ(compared.corrupted, compared.diverged);
  // The same run, so the same tokens, whichever detectors watch it.
  EXPECT_EQ(blind.tokens, audited.tokens);
}

// Sessions opening with the same system prompt share its pages through the prefix cache, in graph
// mode, with the same replies as each session run alone without it.
TEST(Stress, PrefixCacheSharesASystemPromptWithTheReferenceReplies) {
  StressConfig c = small_config();
  c.shape.system_prompt = 80;
  c.cells = {{KvDtype::kBf16, RunMode::kGraph, false, true}};
  const CellResult r = run_stress(c).cells.at(0);
  EXPECT_EQ(r.corrupted, 0);
  EXPECT_EQ(r.diverged, 0);
  EXPECT_EQ(r.audit_findings, 0);
  EXPECT_GE(r.stats.prefix_cache_hits, int64_t(kPageSize) * 4);  // most sessions found page 0
  EXPECT_EQ(r.clobbered_slots, 0);
}

TEST(Stress, BadShapesAreRejected) {
  StressConfig c = small_config();
  c.shape.min_turns = 0;
  EXPECT_THROW(run_stress(c), Error);
  c = small_config();
  c.shape.min_reply = 9;
  c.shape.max_reply = 8;
  EXPECT_THROW(run_stress(c), Error);
  c = small_config();
  c.cells.clear();
  EXPECT_THROW(run_stress(c), Error);
}

}  // namespace
}  // namespace dsa
