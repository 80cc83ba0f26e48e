// The continuous-batching engine: a waiting queue and a running set over one model, one cache and
// one runner, with chunked prefill, preemption by recompute, multi-turn sessions and the optional
// slot-integrity auditor (DESIGN §2, §6).
//
// One engine step is:
//   1. prefill: one eager step of up to max_prefill_rows rows — the rest of the prompts of
//      requests already prefilling (oldest first), then newly admitted ones from the queue front;
//      a prompt may take several steps;
//   2. decode: one runner step (graph or eager) of one row per decoding request, so the batch
//      grows and shrinks, and graph replays pad, as requests come and go.
// After each runner step the auditor (when on) records the slots the real rows wrote and
// verifies its scope; then tokens are sampled, and finished requests release their pages.
//
// With the prefix cache on (DESIGN §8), every full page a request has written joins the cache and
// is shared, read-only, with later requests whose tokens start the same way; a request admitted
// with a cached prefix prefills only the rest (always at least its last prompt token). A session's
// kKeepCache pins its history's pages between turns (they stay shared); kRecompute releases them
// to the cache, where the next turn finds every full page again unless it was evicted. So the
// prefix cache generalizes kKeepCache: a client that resends the whole conversation gets the same
// reuse, and kKeepCache only adds pinning (and the partly filled last page).
//
// Pages are reserved as a request grows. When the pool runs out: unreferenced cached pages go
// first (least recently used), then idle sessions' kept caches (least recently used), then the
// newest running request is preempted — its pages are
// released and it goes back to the queue front, to be prefilled again from its prompt plus the
// tokens it has generated (which it keeps). A request that cannot fit even alone fails with
// kResourceExhausted; one past the context fails with kOutOfRange. Nothing waits forever.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dsa/auditor.h"
#include "dsa/cache.h"
#include "dsa/error.h"
#include "dsa/model.h"
#include "dsa/prefix_cache.h"
#include "dsa/runner.h"
#include "dsa/sampler.h"
#include "dsa/shadow_oracle.h"
#include "dsa/step_timing.h"

namespace dsa {

// What a session does with its history's pages between turns.
enum class SessionPolicy : uint8_t {
  kKeepCache,  // keep them: a turn prefills only its new tokens
  kRecompute,  // release them at the end of each turn: every turn prefills the whole history
};

struct EngineOptions {
  RunnerOptions runner;      // decode: eager or graph buckets, faults
  int max_prefill_rows = 0;  // rows per prefill step; 0: the model's max_rows
  int max_running = 0;       // requests admitted at once; 0 (and at most): the model's max_rows
  bool audit = false;        // run the slot-integrity auditor
  // Run the shadow oracle too (fault-injection runs): an independent count of clobbered slots,
  // matched against the auditor's findings in EngineStats.
  bool oracle = false;
  AuditScope audit_scope = AuditScope::kListed;  // kListed: the slots read in the step
  int audit_sample = 256;                        // kSample: slots per verification
  uint64_t audit_seed = 0;                       // kSample: the sample's seed
  bool prefix_cache = false;  // share full pages across requests and turns (DESIGN §8)
};

struct RequestParams {
  int max_new_tokens = 16;
  int32_t stop_token = -1;  // < 0: none
  SamplingParams sampling;
};

enum class FinishReason : uint8_t { kStop, kLength, kAborted, kFailed };
const char* finish_reason_name(FinishReason r);

struct RequestOutput {
  int64_t id = -1;
  int64_t session = -1;         // -1 for a plain request
  std::vector<int32_t> tokens;  // generated tokens (kept across preemptions)
  int prompt_tokens = 0;        // history + new tokens for a session turn
  int cached_tokens = 0;  // prompt tokens not prefilled at first admission (cache or kept history)
  FinishReason reason = FinishReason::kLength;
  std::optional<ErrorCode> error;  // kFailed: why
  std::string message;
  int preemptions = 0;
  bool corrupted = false;  // the auditor found one of its slots changed
  std::vector<AuditFinding> findings;
};

struct SessionState {
  SessionPolicy policy = SessionPolicy::kKeepCache;
  std::vector<int32_t> history;   // every finished turn's prompt and reply
  int turns = 0;                  // finished turns
  int64_t active_request = -1;    // the running or waiting turn, -1 when idle
  bool corrupted = false;         // any auditor finding on the session's slots
  int first_corrupted_turn = -1;  // 0-based turn during which the first finding came
  std::vector<AuditFinding> findings;
};

// One token sampled for a request during a step (see Engine::new_tokens()).
struct NewToken {
  int64_t request = -1;
  int32_t token = 0;
};

struct EngineStats {
  int64_t steps = 0;  // engine steps
  int64_t prefill_steps = 0, decode_steps = 0;
  int64_t prefill_rows = 0, decode_rows = 0;
  int64_t padded_rows = 0;  // graph replays: bucket - real rows, summed
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t evicted_sessions = 0;        // idle sessions whose kept cache was released for room
  int64_t store_errors = 0;            // the runner's error flags (stores, page ids), summed
  int64_t failed_by_store_errors = 0;  // requests failed because a step raised the flag
  int64_t audit_findings = 0;
  std::map<int, int64_t> graph_replays;  // decode steps replayed per bucket size
  int64_t prefix_cache_queries = 0;      // prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;         // of those, tokens found (not prefilled)
  int64_t prefix_cache_evictions = 0;    // cached pages freed for room
  int64_t cached_pages = 0;              // pages held by the prefix cache after the last step
  // With the oracle on: slot changes it saw, how many of them the auditor also reported (in the
  // same step, or later while the slot was still watched: by its scope, or when released), and
  // auditor findings the oracle never saw.
  int64_t oracle_clobbers = 0;
  int64_t auditor_found = 0;
  int64_t auditor_unconfirmed = 0;
  // Wall time of engine steps, by phase, summed (step_timing.h); seconds.per_step_us(steps) gives
  // the figures per step.
  StepTimes seconds;
};

class Engine {
 public:
  Engine(Model& model, KvCache& cache, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request and returns its id. Throws kInvalidArgument on an empty prompt, a token
  // outside the vocabulary, max_new_tokens < 1 or bad sampling parameters.
  int64_t submit(std::vector<int32_t> prompt, const RequestParams& params);

  int64_t open_session(SessionPolicy policy);
  // Queues the session's next turn: its history plus new_tokens is the prompt. Returns the turn's
  // request id. Throws kInvalidArgument when a turn is already active or the session is unknown.
  int64_t submit_turn(int64_t session, std::vector<int32_t> new_tokens,
                      const RequestParams& params);
  // Aborts any active turn and releases the session's pages.
  void close_session(int64_t session);
  const SessionState& session(int64_t session) const;

  // Aborts a waiting or running request: everything it holds is released. False when unknown or
  // already finished.
  bool abort(int64_t id);

  // One engine step (prefill, then decode). Returns false when there was no work.
  bool step();
  // Steps until no request is waiting or running.
  void run_until_idle();
  bool idle() const { return waiting_.empty() && running_.empty(); }

  // Outputs of requests finished since the last call, in finishing order.
  std::vector<RequestOutput> take_finished();
  // The tokens sampled during the last step(), in sampling order (a request's in output order),
  // cleared when the next step starts: a streaming caller forwards them after every step. A
  // request's final token appears here as well as in its RequestOutput.
  const std::vector<NewToken>& new_tokens() const { return new_tokens_; }

  const EngineStats& stats() const { return stats_; }
  const EngineOptions& options() const { return options_; }
  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return running_.size(); }
  const SlotAuditor* auditor() const { return auditor_.get(); }
  const PrefixCache* prefix_cache() const { return prefix_.get(); }
  // Recounts every page from the page tables of requests and sessions: free + used + cached =
  // total - 1, every owned page in exactly one table, every cached page's reference count equal
  // to the tables sharing it, and the prefix cache's own invariants. Throws kInternal naming the
  // first mismatch. O(pages): for tests and diagnostics.
  void check_page_accounting() const;
  // Frees every cached page no request or session references; returns how many.
  int64_t drop_cached_pages();

 private:
  struct Request;
  struct Session;

  enum class Admission : uint8_t { kAdmitted, kFailed, kWait };

  int64_t enqueue(std::unique_ptr<Request> r);
  void validate(const std::vector<int32_t>& tokens, const RequestParams& params) const;
  Admission admit(Request& r, int budget, int64_t* chunk_rows);
  bool reserve(Request& r, int64_t n_tokens);
  bool grow(Request& r, int64_t n_tokens);
  bool evict_idle_session();
  bool evict_cached_pages(int64_t n);
  void share_cached_prefix(Request& r);
  void share_written_pages(std::span<Request* const> requests);
  void check_store_targets(std::span<const RowInput> rows, std::span<Request* const> owners);
  void forget_finished(std::span<Request*> requests, std::span<const int64_t> ids,
                       int64_t finishes_before);
  std::vector<int64_t> sharers_of(int32_t page) const;
  void preempt(Request& r);
  void release_pages(PageTable& pages);
  void keep_tail(Request& r);
  void unwatch(std::span<const int32_t> pages);
  void finish(Request& r, FinishReason reason);
  void end_turn(Request& r, bool completed);
  void fail(Request& r, ErrorCode code, std::string message);

  bool prefill_step();
  bool decode_step();
  RowInput row_of(const Request& r, int64_t position) const;
  RowSampling sampling_of(const Request& r) const;  // r's next draw
  void after_runner_step(const std::vector<Request*>& row_owners, const std::vector<RowInput>& rows,
                         const StepResult& result);
  void audit(const std::vector<Request*>& readers);
  void report_findings(std::vector<AuditFinding> findings);
  void fail_for_store_errors(const std::vector<Request*>& row_owners,
                             const std::vector<RowInput>& rows, const StepResult& result);
  void mark_corrupted(const AuditFinding& finding);
  void mark_owner(int64_t owner, const AuditFinding& finding);
  void sample_next(Request& r, int32_t token);   // appends the step's token to r
  void charge_runner(const StepResult& result);  // splits a runner call's time into the phases

  Request* find(int64_t id);
  int64_t owner_of(const Request& r) const;

  Model& model_;
  KvCache& cache_;
  EngineOptions options_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<SlotAuditor> auditor_;
  std::unique_ptr<PrefixCache> prefix_;  // null when options_.prefix_cache is off
  std::unique_ptr<ShadowOracle> oracle_;
  RecallTally recall_;  // the oracle's clobbers against the auditor's findings
  int64_t next_id_ = 1;
  int64_t next_admit_ = 0;
  std::deque<int64_t> waiting_;
  std::vector<Request*> running_;                         // admission order, oldest first
  std::map<int64_t, std::unique_ptr<Request>> requests_;  // waiting and running
  // Requests finished so far. A step holds pointers to its requests across calls that may finish
  // some (a step's error flag fails them); when this count moved, it looks them up again.
  int64_t finishes_ = 0;
  // Per-step working lists, kept between steps so a step allocates nothing once they have grown.
  struct Scratch {
    struct Chunk {
      Request* r;
      int64_t start, count;  // prefill rows [start, start + count) of r
    };
    std::vector<Chunk> plan;
    std::vector<Request*> candidates, batch, owners;
    std::vector<int64_t> ids, slots;
    std::vector<RowInput> rows;
    std::vector<RowSampling> sampling;
  } scratch_;
  std::map<int64_t, std::unique_ptr<Session>> sessions_;
  std::vector<RequestOutput> finished_;
  std::vector<NewToken> new_tokens_;  // sampled during the current (or last) step
  EngineStats stats_;
  PhaseTimer timer_;          // the current step's phases, added to stats_.seconds at its end
  int64_t runner_steps_ = 0;  // the auditor's clock
  bool progress_ = false;     // a request finished during the current step
};

}  // namespace dsa
