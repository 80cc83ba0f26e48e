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
    if (c.cell.prefix_cache) {
      EXPECT_GT(c.stats.prefix_cache_queries, 0);
    }
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
  EXPECT_NE(table.find("| bf16 index-K + eager + guarded | 0/8 (0%) | 0 | 0 | 0 | 0 | - | 0 |"),
            std::string::npos);
  // The detectors agree in every cell: the auditor reported every change the oracle saw (run in
  // the faulted cells), every divergence had a finding, some findings changed tokens, and no
  // turn failed.
  for (const CellResult& c : report.cells) {
    SCOPED_TRACE(c.cell.condition());
    EXPECT_EQ(c.oracle, c.cell.faults);
    EXPECT_EQ(c.auditor_found, c.oracle_clobbers);
    EXPECT_EQ(c.auditor_unconfirmed, 0);
    EXPECT_EQ(c.diverged_not_flagged, 0);
    EXPECT_EQ(c.failed_turns, 0);
  }
  const CellResult& incident = find(report, incident_cell());
  EXPECT_GT(incident.oracle_clobbers, 0);
  EXPECT_GT(incident.flagged_and_diverged, 0);
  EXPECT_GT(report.config["sessions_longer_than_index_topk"].get<int>(), 0);
  const StressVerdict v = stress_verdict(report);
  EXPECT_EQ(v.line, "fingerprint: reproduced");
  EXPECT_EQ(v.exit_code, kStressExitClean);
  EXPECT_TRUE(v.problems.empty());
  EXPECT_EQ(j["verdict"], "fingerprint: reproduced");
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

// The verdict, on hand-made reports: each way the fingerprint can be wrong names its cell and
// exits 1; lost work exits 3.
TEST(Stress, VerdictFollowsTheFingerprint) {
  auto report = [](std::vector<std::pair<StressCell, int>> corrupted) {
    StressReport r;
    for (auto [cell, k] : corrupted) {
      CellResult c;
      c.cell = cell;
      c.sessions = 10;
      c.corrupted = c.auditor_flagged = k;
      r.cells.push_back(c);
    }
    return r;
  };
  const StressCell guarded{KvDtype::kBf16, RunMode::kGraph, false};
  const StressCell fp8_faults{KvDtype::kFp8, RunMode::kGraph, true};
  const StressCell eager_faults{KvDtype::kBf16, RunMode::kEager, true};

  StressVerdict v = stress_verdict(report({{incident_cell(), 3}, {guarded, 0}, {fp8_faults, 0}}));
  EXPECT_EQ(v.line, "fingerprint: reproduced");
  EXPECT_EQ(v.exit_code, kStressExitClean);

  v = stress_verdict(report({{incident_cell(), 0}, {guarded, 0}}));  // the incident cell is clean
  EXPECT_EQ(v.exit_code, kStressExitCorruption);
  EXPECT_NE(v.line.find("NOT reproduced: bf16 index-K + graph + incident faults"),
            std::string::npos)
      << v.line;

  v = stress_verdict(report({{incident_cell(), 2}, {guarded, 1}}));  // a guarded cell corrupts
  EXPECT_EQ(v.exit_code, kStressExitCorruption);
  EXPECT_NE(v.line.find("NOT reproduced: bf16 index-K + graph + guarded"), std::string::npos);

  v = stress_verdict(report({{incident_cell(), 2}, {eager_faults, 1}}));  // another faulted cell
  EXPECT_EQ(v.exit_code, kStressExitCorruption);
  EXPECT_NE(v.line.find("bf16 index-K + eager + incident faults"), std::string::npos);

  v = stress_verdict(report({{guarded, 0}}));  // no incident cell: nothing contradicts
  EXPECT_EQ(v.exit_code, kStressExitClean);
  EXPECT_NE(v.line.find("not run"), std::string::npos);

  StressReport missed = report({{incident_cell(), 2}});
  missed.cells[0].oracle = true;
  missed.cells[0].oracle_clobbers = 14;
  missed.cells[0].auditor_found = 13;
  v = stress_verdict(missed);  // the auditor missed one of the oracle's clobbers
  EXPECT_EQ(v.exit_code, kStressExitCorruption);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_NE(v.problems[0].find("13 of the oracle's 14"), std::string::npos);

  StressReport lost = report({{incident_cell(), 2}});
  lost.cells[0].failed_turns = 5;
  lost.cells[0].failed_sessions = 3;
  v = stress_verdict(lost);
  EXPECT_EQ(v.exit_code, kStressExitLostWork);
  EXPECT_NE(stress_table(lost).find("| 5 |"), std::string::npos);
}

// A pool that cannot hold the longest session alone is a usage error before anything runs; the
// engine would fail every turn of it and the table would look clean.
TEST(Stress, PoolTooSmallForOneSessionIsRefusedUpFront) {
  StressConfig c = small_config();
  c.pages = 2;
  try {
    run_stress(c);
    ADD_FAILURE() << "a 2-page pool was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--pages 2"), std::string::npos) << e.what();
  }
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
