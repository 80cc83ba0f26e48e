// dsa stress: many concurrent multi-turn sessions against the engine, in one process, across the
// incident's matrix of conditions (index-K dtype x runner mode x faults), with both detectors of
// DESIGN §6 on every session: the slot-integrity auditor, and divergence from the same session
// run alone, eagerly, without faults.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsa/backend.h"
#include "dsa/engine.h"

namespace dsa {

// Upper bounds of the workload's shape, so every sum of turns and tokens stays far from int
// overflow; a session still ends at the context.
inline constexpr int kMaxStressTurns = 1000;
inline constexpr int kMaxStressTokens = 1 << 20;  // per turn's prompt or reply; also step gaps

// The workload's shape. Every session draws its turn count, per-turn message and reply lengths,
// arrival and think times from its own seeded stream, so a seed names the workload exactly.
struct StressShape {
  int sessions = 60;
  int concurrency = 60;  // sessions active at once
  int min_turns = 2, max_turns = 4;
  int min_prompt = 24, max_prompt = 96;  // new tokens per turn (user message or tool result)
  int min_reply = 8, max_reply = 24;     // tokens generated per turn
  int max_arrival_gap = 3;               // engine steps between arrivals, drawn from [0, gap]
  int max_think = 4;      // engine steps between a reply and the next turn, [0, think]
  int system_prompt = 0;  // tokens of one system prompt opening every session's first turn
  SessionPolicy policy = SessionPolicy::kKeepCache;
  uint64_t seed = 1;
  void validate() const;  // kInvalidArgument naming the bad field
};

struct StressCell {
  KvDtype index_k = KvDtype::kBf16;
  RunMode runner = RunMode::kGraph;
  bool faults = false;            // the incident: stale-padding + unguarded-store
  bool prefix_cache = false;      // the engine shares full pages across requests and turns
  std::string condition() const;  // "bf16 index-K + graph + incident faults [+ prefix cache]"
};
// The 8 cells of index-K x runner x faults, then bf16 index-K + graph, guarded and with the
// incident's faults, with the prefix cache on; in the table's order.
std::vector<StressCell> stress_matrix();

struct StressConfig {
  std::string preset = "tiny";
  int layers = 0;  // layers kept from the preset (0: all)
  BackendKind backend = BackendKind::kCpu;
  uint64_t weight_seed = 0;
  int max_rows = 64;         // rows per step: the prefill chunk and the largest bucket
  std::vector<int> buckets;  // graph buckets; empty: the default list up to max_rows
  int64_t pages = 0;         // pages per pool; 0: a third of the concurrent sessions' need
  StressShape shape;
  std::vector<StressCell> cells = stress_matrix();
  bool audit = true;              // the auditor on every session
  bool compare_reference = true;  // divergence from the session run alone
  AuditScope audit_scope = AuditScope::kAll;
};

struct CellResult {
  StressCell cell;
  int sessions = 0;
  int corrupted = 0;  // flagged or diverged
  int auditor_flagged = 0;
  int diverged = 0;
  int flagged_and_diverged = 0;  // auditor findings that also changed a session's tokens
  int diverged_not_flagged = 0;  // divergence the auditor did not explain
  int failed_turns = 0;          // turns that ended with an error: lost work, never clean
  int failed_sessions = 0;       // sessions with a failed turn
  // The shadow oracle (on in fault-injection cells): slot changes it saw, how many of them the
  // auditor reported too, and findings with no change behind them.
  bool oracle = false;
  int64_t oracle_clobbers = 0, auditor_found = 0, auditor_unconfirmed = 0;
  std::vector<int> first_divergent_turns;  // per diverged session, 0-based
  int64_t tokens = 0;                      // generated
  double seconds = 0;
  int64_t audit_findings = 0;
  // Blast radius: distinct slots the auditor found changed (one slot at one step, any layer or
  // pool), and the sessions each such finding named, on average (a cached page's finding names
  // every session sharing it).
  int64_t clobbered_slots = 0;
  double sessions_per_clobbered_slot = 0;
  EngineStats stats;
};

struct StressProgress {
  int cell = 0, cells = 0;  // the cell running, 0-based, of how many
  std::string phase;        // "reference" or the cell's condition
  int sessions_done = 0, sessions = 0;
  int corrupted = 0;  // so far in this cell
  int64_t tokens = 0;
  double seconds = 0;
};
using StressProgressFn = std::function<void(const StressProgress&)>;

struct StressReport {
  std::vector<CellResult> cells;
  nlohmann::json config;
  double reference_seconds = 0;
  bool guarded_clean() const;  // no corruption in any cell without faults
};

// Throws kInvalidArgument before anything runs when the shape is bad or the pool cannot hold the
// longest session alone (every turn of it would fail).
StressReport run_stress(const StressConfig& config, const StressProgressFn& progress = {});
// The model a stress run builds: the preset, cut to config.layers.
ModelConfig stress_model_config(const StressConfig& config);

// dsa stress's exit codes.
inline constexpr int kStressExitClean = 0;
inline constexpr int kStressExitCorruption = 1;  // the fingerprint is wrong, or a detector missed
inline constexpr int kStressExitUsage = 2;       // bad flags (said before the run)
inline constexpr int kStressExitLostWork = 3;    // failed turns or store errors: not a clean run

// The judgement of a run against the incident's fingerprint (DESIGN §5): only the incident cell
// (bf16 index-K + graph + incident faults) corrupts, and it does when it is in the matrix; the
// detectors agree (the auditor reported every change the oracle saw, and every divergence); no
// turn failed and no step raised its error flag.
struct StressVerdict {
  std::string line;  // "fingerprint: reproduced" / "fingerprint: NOT reproduced: .."
  std::vector<std::string> problems;  // one line each, naming the cell
  int exit_code = kStressExitClean;
};
StressVerdict stress_verdict(const StressReport& report);

// The incident's table: condition | corrupted sessions (k/N, %) | auditor flagged | diverged.
std::string stress_table(const StressReport& report);
nlohmann::json stress_json(const StressReport& report);
std::string stress_svg(const StressReport& report);  // a bar chart of corrupted %, per cell

}  // namespace dsa
