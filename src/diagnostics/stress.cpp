// dsa stress: the seeded workload, the driver that plays it against an engine on a virtual clock
// of engine steps, the per-session references, and the matrix of cells.
#include "dsa/stress.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>

#include "dsa/config.h"
#include "dsa/error.h"

namespace dsa {
namespace {

// One session of the workload: when it arrives, and what each turn says and may reply.
struct SessionPlan {
  int64_t arrival = 0;                      // engine step
  std::vector<std::vector<int32_t>> turns;  // each turn's new tokens
  std::vector<int> replies;                 // max_new_tokens per turn
  std::vector<int> think;                   // steps after turn t's reply before turn t + 1
};

// What one session produced in one run.
struct SessionRun {
  std::vector<std::vector<int32_t>> replies;  // per finished turn
  std::vector<bool> failed;
  bool flagged = false;
  int first_flagged_turn = -1;
  std::vector<AuditFinding> findings;
};

std::vector<SessionPlan> make_workload(const StressShape& shape, int vocab, int max_context) {
  std::vector<SessionPlan> plans(size_t(shape.sessions));
  std::vector<int32_t> system(size_t(shape.system_prompt), 0);  // the same for every session
  std::mt19937_64 system_rng(shape.seed);
  for (auto& tok : system) tok = std::uniform_int_distribution<int>(0, vocab - 1)(system_rng);
  int64_t clock = 0;
  for (int i = 0; i < shape.sessions; ++i) {
    std::mt19937_64 rng(shape.seed * 0x9E3779B97F4A7C15ull + uint64_t(i));
    auto draw = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    SessionPlan& p = plans[size_t(i)];
    clock += draw(0, shape.max_arrival_gap);
    p.arrival = clock;
    const int turns = draw(shape.min_turns, shape.max_turns);
    int context = 0;
    for (int t = 0; t < turns; ++t) {
      const int prompt =
          draw(shape.min_prompt, shape.max_prompt) + (t == 0 ? int(system.size()) : 0);
      const int reply = draw(shape.min_reply, shape.max_reply);
      if (context + prompt + reply > max_context) break;  // the session ends at the context
      context += prompt + reply;
      std::vector<int32_t> tokens(static_cast<size_t>(prompt), 0);
      for (auto& tok : tokens) tok = draw(0, vocab - 1);
      if (t == 0) std::copy(system.begin(), system.end(), tokens.begin());
      p.turns.push_back(std::move(tokens));
      p.replies.push_back(reply);
      p.think.push_back(draw(0, shape.max_think));
    }
    require(!p.turns.empty(), ErrorCode::kInvalidArgument,
            "a first turn of up to {} + {} tokens does not fit the context of {}", shape.max_prompt,
            shape.max_reply, max_context);
  }
  return plans;
}

// Plays `plans` against the engine: sessions start at their arrival, at most `concurrency` at a
// time; each submits its next turn `think` steps after its previous reply. The clock is engine
// steps; when the engine is idle it jumps to the next event.
std::vector<SessionRun> drive(Engine& engine, const std::vector<SessionPlan>& plans,
                              int concurrency, SessionPolicy policy,
                              const std::function<void(size_t, const SessionRun&)>& on_done) {
  struct Live {
    int64_t session = -1;
    int next_turn = 0;
    int64_t due = 0;
    bool in_turn = false;
  };
  const size_t n = plans.size();
  std::vector<SessionRun> runs(n);
  std::vector<Live> live(n);
  std::map<int64_t, size_t> by_request;
  size_t next_arrival = 0, done = 0;
  int active = 0;
  int64_t clock = 0;
  while (done < n) {
    while (next_arrival < n && active < concurrency && plans[next_arrival].arrival <= clock) {
      live[next_arrival].session = engine.open_session(policy);
      live[next_arrival].due = clock;
      ++active;
      ++next_arrival;
    }
    int64_t next_event = INT64_MAX;
    for (size_t i = 0; i < next_arrival; ++i) {
      Live& l = live[i];
      if (l.session < 0 || l.in_turn) continue;
      if (l.due > clock) {
        next_event = std::min(next_event, l.due);
        continue;
      }
      RequestParams params;
      params.max_new_tokens = plans[i].replies[size_t(l.next_turn)];
      by_request[engine.submit_turn(l.session, plans[i].turns[size_t(l.next_turn)], params)] = i;
      l.in_turn = true;
    }
    if (engine.idle()) {  // nothing to run: jump to the next arrival or turn
      if (next_arrival < n && active < concurrency) {
        next_event = std::min(next_event, plans[next_arrival].arrival);
      }
      require(next_event != INT64_MAX, ErrorCode::kInternal, "stress driver: no next event");
      clock = std::max(clock + 1, next_event);
      continue;
    }
    engine.step();
    ++clock;
    for (RequestOutput& out : engine.take_finished()) {
      const size_t i = by_request.at(out.id);
      Live& l = live[i];
      SessionRun& run = runs[i];
      run.replies.push_back(std::move(out.tokens));
      run.failed.push_back(out.reason == FinishReason::kFailed);
      l.in_turn = false;
      l.due = clock + plans[i].think[size_t(l.next_turn)];
      if (++l.next_turn < int(plans[i].turns.size()) && out.reason != FinishReason::kFailed) {
        continue;
      }
      const SessionState& st = engine.session(l.session);
      run.flagged = st.corrupted;
      run.first_flagged_turn = st.first_corrupted_turn;
      run.findings = st.findings;
      engine.close_session(l.session);
      l.session = -1;
      --active;
      ++done;
      if (on_done) on_done(i, run);
    }
  }
  return runs;
}

// The first turn whose reply (or failure) differs from the reference's; -1 when none does.
int first_divergent_turn(const SessionRun& run, const SessionRun& reference) {
  const size_t turns = std::max(run.replies.size(), reference.replies.size());
  for (size_t t = 0; t < turns; ++t) {
    if (t >= run.replies.size() || t >= reference.replies.size()) return int(t);
    if (run.replies[t] != reference.replies[t] || run.failed[t] != reference.failed[t]) {
      return int(t);
    }
  }
  return -1;
}

struct Stack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  CacheConfig cache;
};

enum class Detectors : uint8_t { kNone, kAsConfigured };  // references run without any

EngineOptions engine_options(const StressConfig& c, const StressCell& cell, Detectors detectors) {
  const bool audit = detectors == Detectors::kAsConfigured && c.audit;
  EngineOptions o;
  o.runner.mode = cell.runner;
  if (!c.buckets.empty()) o.runner.buckets = c.buckets;
  o.runner.faults.stale_padding = o.runner.faults.unguarded_store = cell.faults;
  o.audit = audit;
  o.oracle = audit && cell.faults;  // fault-injection cells: the auditor's recall is measured
  o.audit_scope = c.audit_scope;
  o.prefix_cache = cell.prefix_cache;
  o.max_running = std::min(c.max_rows, c.shape.concurrency);
  return o;
}

// A serving pool runs full: by default it holds a third of what the concurrent sessions could
// need at their longest (and always one longest session), so idle sessions' caches are evicted
// and requests preempted under pressure, and pages change hands between sessions all the time.
//
// That matters for the incident. A stale padded row replays the previous replay's row whole:
// token, position, slot, page table. While that row's owner still holds the slot, the unguarded
// store rewrites the very bytes the owner wrote (the stale row recomputes them from the same
// inputs and the same cache), which is harmless. It corrupts when the slot has meanwhile been
// released and handed to another session, or when a never-used row's -1 sentinel wraps to the
// pool's last slot and that page is in use: both need pages that change hands and a pool that
// runs full. A roomy pool (--pages) shows the fingerprint much more rarely.
int64_t default_pool_pages(int concurrency, int64_t longest_tokens) {
  const int64_t longest_pages = (longest_tokens + kPageSize - 1) / kPageSize;
  return 1 + std::max(longest_pages, (concurrency * longest_pages + 2) / 3);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void StressShape::validate() const {
  auto range = [](int lo, int hi, const char* what, int limit) {
    require(lo >= 1 && lo <= hi && hi <= limit, ErrorCode::kInvalidArgument,
            "{}: min {} and max {} must satisfy 1 <= min <= max <= {}", what, lo, hi, limit);
  };
  require(sessions >= 1 && concurrency >= 1, ErrorCode::kInvalidArgument,
          "sessions = {} and concurrency = {} must be >= 1", sessions, concurrency);
  range(min_turns, max_turns, "turns", kMaxStressTurns);
  range(min_prompt, max_prompt, "prompt tokens per turn", kMaxStressTokens);
  range(min_reply, max_reply, "reply tokens per turn", kMaxStressTokens);
  require(max_arrival_gap >= 0 && max_think >= 0 && max_arrival_gap <= kMaxStressTokens &&
              max_think <= kMaxStressTokens,
          ErrorCode::kInvalidArgument, "arrival gap {} and think time {} must be in [0, {}]",
          max_arrival_gap, max_think, kMaxStressTokens);
  require(system_prompt >= 0, ErrorCode::kInvalidArgument,
          "system prompt of {} tokens must be >= 0", system_prompt);
}

std::string StressCell::condition() const {
  return fmt::format("{} index-K + {} + {}{}", kv_dtype_name(index_k),
                     runner == RunMode::kGraph ? "graph" : "eager",
                     faults ? "incident faults" : "guarded", prefix_cache ? " + prefix cache" : "");
}

std::vector<StressCell> stress_matrix() {
  std::vector<StressCell> cells;
  for (bool faults : {false, true}) {
    for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
      for (RunMode mode : {RunMode::kEager, RunMode::kGraph})
        cells.push_back({dtype, mode, faults, false});
    }
  }
  for (bool faults : {false, true})
    cells.push_back({KvDtype::kBf16, RunMode::kGraph, faults, true});
  return cells;
}

namespace {
bool is_incident_cell(const StressCell& c) {
  return c.index_k == KvDtype::kBf16 && c.runner == RunMode::kGraph && c.faults && !c.prefix_cache;
}
// The incident's faults with the prefix cache on: its corruption rate and blast radius are a
// finding to report, not part of the fingerprint (detection is still judged below).
bool is_finding_cell(const StressCell& c) { return c.faults && c.prefix_cache; }
}  // namespace

StressVerdict stress_verdict(const StressReport& report) {
  StressVerdict v;
  std::string wrong_cell;  // the first cell that contradicts the fingerprint
  bool incident_run = false;
  for (const CellResult& c : report.cells) {
    const std::string name = c.cell.condition();
    if (is_finding_cell(c.cell)) continue;
    if (is_incident_cell(c.cell)) {
      incident_run = true;
      if (c.corrupted == 0) {
        v.problems.push_back(
            fmt::format("{}: no session corrupted; the incident's cell must", name));
        if (wrong_cell.empty()) wrong_cell = name + " shows no corruption";
      }
    } else if (c.corrupted > 0) {
      v.problems.push_back(fmt::format("{}: {} of {} sessions corrupted; this cell must stay clean",
                                       name, c.corrupted, c.sessions));
      if (wrong_cell.empty()) wrong_cell = fmt::format("{} corrupted {}", name, c.corrupted);
    }
  }
  v.line = !wrong_cell.empty() ? "fingerprint: NOT reproduced: " + wrong_cell
           : incident_run      ? "fingerprint: reproduced"
                               : "fingerprint: not run (the matrix has no bf16 index-K + graph + "
                                 "incident faults cell; the cells that ran are clean)";
  if (!wrong_cell.empty()) v.exit_code = kStressExitCorruption;

  for (const CellResult& c : report.cells) {
    const std::string name = c.cell.condition();
    if (c.oracle && (c.auditor_found != c.oracle_clobbers || c.auditor_unconfirmed > 0)) {
      v.problems.push_back(
          fmt::format("{}: the auditor reported {} of the oracle's {} clobbered slots ({} findings "
                      "unconfirmed)",
                      name, c.auditor_found, c.oracle_clobbers, c.auditor_unconfirmed));
      v.exit_code = kStressExitCorruption;
    }
    if (c.diverged_not_flagged > 0) {
      v.problems.push_back(fmt::format("{}: {} sessions diverged without an auditor finding", name,
                                       c.diverged_not_flagged));
      v.exit_code = kStressExitCorruption;
    }
  }
  for (const CellResult& c : report.cells) {
    const std::string name = c.cell.condition();
    if (c.failed_turns > 0) {
      v.problems.push_back(fmt::format("{}: {} turns of {} sessions failed (lost work)", name,
                                       c.failed_turns, c.failed_sessions));
    }
    if (c.stats.store_errors > 0) {
      v.problems.push_back(
          fmt::format("{}: steps raised the error flag {} times", name, c.stats.store_errors));
    }
    if ((c.failed_turns > 0 || c.stats.store_errors > 0) && v.exit_code == kStressExitClean) {
      v.exit_code = kStressExitLostWork;
    }
  }
  return v;
}

bool StressReport::guarded_clean() const {
  return std::none_of(cells.begin(), cells.end(),
                      [](const CellResult& c) { return !c.cell.faults && c.corrupted > 0; });
}

ModelConfig stress_model_config(const StressConfig& c) {
  return keep_first_layers(preset_config(c.preset), c.layers);
}

StressReport run_stress(const StressConfig& c, const StressProgressFn& progress) {
  c.shape.validate();
  require(!c.cells.empty(), ErrorCode::kInvalidArgument, "stress: no cells to run");
  Stack s;
  const ModelConfig config = stress_model_config(c);
  s.backend = make_backend(c.backend);
  const int context = std::min(config.max_position_embeddings, 4096);
  s.model = std::make_unique<Model>(*s.backend, config,
                                    Weights::synthetic(*s.backend, config, c.weight_seed),
                                    c.max_rows, context);
  const std::vector<SessionPlan> plans = make_workload(c.shape, config.vocab_size, context);
  int64_t longest = 0;  // tokens of the longest session
  for (const SessionPlan& p : plans) {
    int64_t total = 0;
    for (size_t t = 0; t < p.turns.size(); ++t) total += int64_t(p.turns[t].size()) + p.replies[t];
    longest = std::max(longest, total);
  }
  s.cache.num_layers = config.num_hidden_layers;
  s.cache.num_pages = c.pages > 0 ? c.pages : default_pool_pages(c.shape.concurrency, longest);
  require_memory_fits(estimate_memory(config, c.max_rows, context, s.cache), config, s.cache,
                      s.backend->memory_capacity_bytes(),
                      fmt::format("stress (--pages {})", s.cache.num_pages), s.backend->describe());
  const int64_t longest_pages = (longest + kPageSize - 1) / kPageSize;
  require(longest_pages <= s.cache.num_pages - 1, ErrorCode::kInvalidArgument,
          "--pages {} gives {} usable pages, but the longest session of this workload needs {} "
          "pages for {} tokens: its turns would fail; use --pages {} or more",
          s.cache.num_pages, s.cache.num_pages - 1, longest_pages, longest, longest_pages + 1);
  int longer_than_topk = 0;
  for (const SessionPlan& p : plans) {
    int64_t total = 0;
    for (size_t t = 0; t < p.turns.size(); ++t) total += int64_t(p.turns[t].size()) + p.replies[t];
    longer_than_topk += total > config.index_topk;
  }

  StressReport report;
  report.config = {{"preset", c.preset},
                   {"layers", config.num_hidden_layers},
                   {"backend", std::string(backend_name(c.backend))},
                   {"device", s.backend->describe()},
                   {"weight_seed", c.weight_seed},
                   {"seed", c.shape.seed},
                   {"sessions", c.shape.sessions},
                   {"concurrency", c.shape.concurrency},
                   {"turns", {c.shape.min_turns, c.shape.max_turns}},
                   {"prompt_tokens", {c.shape.min_prompt, c.shape.max_prompt}},
                   {"reply_tokens", {c.shape.min_reply, c.shape.max_reply}},
                   {"max_arrival_gap", c.shape.max_arrival_gap},
                   {"max_think", c.shape.max_think},
                   {"system_prompt", c.shape.system_prompt},
                   {"policy", c.shape.policy == SessionPolicy::kKeepCache ? "keep" : "recompute"},
                   {"max_rows", c.max_rows},
                   {"pages", s.cache.num_pages},
                   {"longest_session_tokens", longest},
                   {"index_topk", config.index_topk},
                   {"sessions_longer_than_index_topk", longer_than_topk},
                   {"audit", c.audit},
                   {"compare_reference", c.compare_reference}};
  const int n = c.shape.sessions;

  // References: each session alone, eager, no faults, per index-K dtype; computed once.
  std::map<KvDtype, std::vector<SessionRun>> references;
  const auto t_ref = std::chrono::steady_clock::now();
  for (const StressCell& cell : c.cells) {
    if (!c.compare_reference || references.count(cell.index_k)) continue;
    CacheConfig cc = s.cache;
    cc.index_k_dtype = cell.index_k;
    KvCache cache(*s.backend, cc);
    Engine engine(*s.model, cache,
                  engine_options(c, {cell.index_k, RunMode::kEager, false}, Detectors::kNone));
    std::vector<SessionRun>& refs = references[cell.index_k];
    for (int i = 0; i < n; ++i) {
      SessionPlan alone = plans[size_t(i)];
      alone.arrival = 0;
      refs.push_back(drive(engine, {alone}, 1, c.shape.policy, {})[0]);
      if (progress) {
        progress({-1, int(c.cells.size()), fmt::format("{} reference", kv_dtype_name(cell.index_k)),
                  i + 1, n, 0, 0, seconds_since(t_ref)});
      }
    }
  }
  report.reference_seconds = seconds_since(t_ref);

  for (size_t k = 0; k < c.cells.size(); ++k) {
    const StressCell& cell = c.cells[k];
    CacheConfig cc = s.cache;
    cc.index_k_dtype = cell.index_k;
    KvCache cache(*s.backend, cc);
    Engine engine(*s.model, cache, engine_options(c, cell, Detectors::kAsConfigured));
    CellResult r;
    r.cell = cell;
    r.sessions = n;
    const auto t0 = std::chrono::steady_clock::now();
    int done = 0, corrupted_so_far = 0;
    auto diverges = [&](size_t i, const SessionRun& run) {
      return c.compare_reference ? first_divergent_turn(run, references[cell.index_k][i]) : -1;
    };
    auto on_done = [&](size_t i, const SessionRun& run) {
      ++done;
      corrupted_so_far += run.flagged || diverges(i, run) >= 0;
      if (progress) {
        progress({int(k), int(c.cells.size()), cell.condition(), done, n, corrupted_so_far,
                  engine.stats().generated_tokens, seconds_since(t0)});
      }
    };
    const std::vector<SessionRun> runs =
        drive(engine, plans, c.shape.concurrency, c.shape.policy, on_done);
    r.seconds = seconds_since(t0);
    r.stats = engine.stats();
    r.tokens = r.stats.generated_tokens;
    r.audit_findings = r.stats.audit_findings;
    r.oracle = engine.options().oracle;
    r.oracle_clobbers = r.stats.oracle_clobbers;
    r.auditor_found = r.stats.auditor_found;
    r.auditor_unconfirmed = r.stats.auditor_unconfirmed;
    for (int i = 0; i < n; ++i) {
      const SessionRun& run = runs[size_t(i)];
      const int turn = diverges(size_t(i), run);
      if (turn >= 0) r.first_divergent_turns.push_back(turn);
      r.diverged += turn >= 0;
      r.auditor_flagged += run.flagged;
      r.corrupted += turn >= 0 || run.flagged;
      r.flagged_and_diverged += turn >= 0 && run.flagged;
      r.diverged_not_flagged += turn >= 0 && !run.flagged && c.audit;
      const int failed = int(std::count(run.failed.begin(), run.failed.end(), true));
      r.failed_turns += failed;
      r.failed_sessions += failed > 0;
    }
    std::map<std::pair<int64_t, int64_t>, std::set<int>> named;  // (slot, step) -> sessions
    for (int i = 0; i < n; ++i) {
      for (const AuditFinding& f : runs[size_t(i)].findings) {
        named[{f.slot, f.detected_step}].insert(i);
      }
    }
    r.clobbered_slots = int64_t(named.size());
    int64_t sessions_named = 0;
    for (const auto& [slot, sessions] : named) sessions_named += int64_t(sessions.size());
    r.sessions_per_clobbered_slot =
        named.empty() ? 0.0 : double(sessions_named) / double(named.size());
    engine.check_page_accounting();
    require(cache.allocator().used_pages() == 0, ErrorCode::kInternal,
            "stress: {} pages still in use after every session closed",
            cache.allocator().used_pages());
    engine.drop_cached_pages();
    require(cache.allocator().free_pages() == cache.allocator().total_pages() - 1,
            ErrorCode::kInternal,
            "stress: {} cached pages still referenced after every session closed",
            cache.allocator().cached_pages());
    report.cells.push_back(std::move(r));
  }
  return report;
}

}  // namespace dsa
