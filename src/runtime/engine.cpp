// The engine's scheduler: admission, page growth, preemption, prefill and decode steps, and the
// auditor's bookkeeping. Sessions' turn bookkeeping lives in session.cpp.
#include "dsa/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine_state.h"

namespace dsa {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kFailed:
      return "failed";
  }
  return "?";
}

Engine::Engine(Model& model, KvCache& cache, EngineOptions options)
    : model_(model), cache_(cache), options_(std::move(options)) {
  const int max_rows = model_.max_rows();
  if (options_.max_prefill_rows <= 0) options_.max_prefill_rows = max_rows;
  if (options_.max_running <= 0) options_.max_running = max_rows;
  require(options_.max_prefill_rows <= max_rows && options_.max_running <= max_rows,
          ErrorCode::kInvalidArgument,
          "max_prefill_rows = {} and max_running = {} must be at most the model's max_rows = {}",
          options_.max_prefill_rows, options_.max_running, max_rows);
  require(options_.audit_sample >= 1, ErrorCode::kInvalidArgument, "audit_sample = {} must be >= 1",
          options_.audit_sample);
  auto& buckets = options_.runner.buckets;  // buckets above max_rows could never be captured
  std::erase_if(buckets, [max_rows](int b) { return b > max_rows; });
  if (options_.runner.mode == RunMode::kGraph && buckets.empty()) buckets = {max_rows};
  // The auditor's truth is what each real row meant to write, digested by the backend in the
  // step; the oracle's is the store inputs themselves.
  options_.runner.write_digests = options_.audit ? WriteDigests::kOn : WriteDigests::kOff;
  options_.runner.write_values = options_.oracle ? WriteValues::kOn : WriteValues::kOff;
  runner_ = std::make_unique<Runner>(model_, cache_, options_.runner);
  if (options_.audit) auditor_ = std::make_unique<SlotAuditor>(model_.backend(), cache_);
  if (options_.prefix_cache) prefix_ = std::make_unique<PrefixCache>(cache_.allocator());
  if (options_.oracle) oracle_ = std::make_unique<ShadowOracle>(model_.backend(), cache_);
}

Engine::~Engine() = default;

Engine::Request* Engine::find(int64_t id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

int64_t Engine::owner_of(const Request& r) const { return r.session >= 0 ? r.session : r.id; }

void Engine::validate(const std::vector<int32_t>& tokens, const RequestParams& params) const {
  require(!tokens.empty(), ErrorCode::kInvalidArgument, "the prompt is empty");
  const int vocab = model_.config().vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    require(tokens[i] >= 0 && tokens[i] < vocab, ErrorCode::kInvalidArgument,
            "prompt token {} is {}, outside the vocabulary [0, {})", i, tokens[i], vocab);
  }
  require(params.max_new_tokens >= 1, ErrorCode::kInvalidArgument,
          "max_new_tokens = {} must be >= 1", params.max_new_tokens);
  params.sampling.validate();
}

int64_t Engine::submit(std::vector<int32_t> prompt, const RequestParams& params) {
  validate(prompt, params);
  auto r = std::make_unique<Request>();
  r->seq = std::move(prompt);
  r->params = params;
  return enqueue(std::move(r));
}

int64_t Engine::enqueue(std::unique_ptr<Request> r) {
  r->id = next_id_++;
  r->prompt_len = int(r->seq.size());
  r->prefill_end = int64_t(r->seq.size());
  const int64_t id = r->id;
  waiting_.push_back(id);
  requests_[id] = std::move(r);
  return id;
}

// ---- pages -------------------------------------------------------------------------------------

// Owned pages go back to the allocator (and out of the auditor's watch); shared pages lose a
// reference and stay in the prefix cache, watched as the cache's.
void Engine::release_pages(PageTable& pages) {
  const std::span<const int32_t> owned(pages.pages().begin() + pages.shared_pages(),
                                       pages.pages().end());
  unwatch(owned);
  if (prefix_) {
    prefix_->release(pages);
  } else {
    pages.release_all(cache_.allocator());
  }
}

// The pages are leaving their owner (released, evicted from the prefix cache, or swapped for a
// cached copy): the auditor and the oracle stop watching their slots.
void Engine::unwatch(std::span<const int32_t> pages) {
  if (auditor_ || oracle_) {
    const PhaseScope scope(timer_, StepPhase::kAudit);
    std::vector<int64_t> slots;
    slots.reserve(pages.size() * kPageSize);
    for (int32_t page : pages) {
      for (int i = 0; i < kPageSize; ++i) slots.push_back(int64_t(page) * kPageSize + i);
    }
    if (auditor_) {
      // A last look before the slots leave the auditor's watch, whatever its scope: a change that
      // no verification has seen yet is still reported, to its owner.
      report_findings(auditor_->verify(slots, runner_steps_));
      auditor_->forget(slots);
    }
    if (oracle_) {
      oracle_->forget(slots);
      recall_.released(slots);
    }
  }
}

bool Engine::reserve(Request& r, int64_t n_tokens) {
  while (!r.pages.reserve(n_tokens, cache_.allocator())) {
    const int64_t missing = (n_tokens + kPageSize - 1) / kPageSize -
                            int64_t(r.pages.pages().size()) - cache_.allocator().free_pages();
    if (!evict_cached_pages(missing) && !evict_idle_session()) return false;
  }
  return true;
}

// Grows a running request's pages to n_tokens, preempting the newest running requests for room.
// False when r itself was preempted or failed.
bool Engine::grow(Request& r, int64_t n_tokens) {
  while (!reserve(r, n_tokens)) {
    Request* newest = running_.back();
    if (newest != &r) {
      preempt(*newest);
      continue;
    }
    if (running_.size() == 1) {
      fail(r, ErrorCode::kResourceExhausted,
           fmt::format("request {} needs {} pages for {} tokens, but only {} of the pool's {} "
                       "are free with nothing else running",
                       r.id, (n_tokens + kPageSize - 1) / kPageSize, n_tokens,
                       cache_.allocator().free_pages(), cache_.allocator().total_pages() - 1));
    } else {
      preempt(r);
    }
    return false;
  }
  return true;
}

void Engine::preempt(Request& r) {
  spdlog::debug("engine: preempting request {} ({} tokens cached, {} pages)", r.id, r.n_cached,
                r.pages.pages().size());
  keep_tail(r);  // its re-admission may take it back
  release_pages(r.pages);
  r.n_cached = 0;
  r.prefill_end = int64_t(r.seq.size());  // recompute the prompt and every generated token
  r.admit_order = -1;
  ++r.preemptions;
  ++stats_.preemptions;
  std::erase(running_, &r);
  waiting_.push_front(r.id);
}

// Admits the request at the queue front with room for its first prefill chunk. False (and the
// request stays at the front) when the running set is full or the pages are not there now.
Engine::Admission Engine::admit(Request& r, int budget, int64_t* chunk_rows) {
  const int64_t total = int64_t(r.prompt_len) + r.params.max_new_tokens;
  if (total > model_.max_context()) {
    fail(r, ErrorCode::kOutOfRange,
         fmt::format("request {}: prompt of {} tokens plus {} new tokens exceeds the context of "
                     "{} tokens",
                     r.id, r.prompt_len, r.params.max_new_tokens, model_.max_context()));
    return Admission::kFailed;
  }
  const int64_t pages_needed = (total + kPageSize - 1) / kPageSize;
  const int64_t usable = cache_.allocator().total_pages() - 1;
  if (pages_needed > usable) {
    fail(r, ErrorCode::kResourceExhausted,
         fmt::format("request {}: {} tokens need {} pages, but the pool has only {} usable pages",
                     r.id, total, pages_needed, usable));
    return Admission::kFailed;
  }
  if (int(running_.size()) >= options_.max_running) return Admission::kWait;
  r.seq.reserve(size_t(total));  // within the context: appending tokens never reallocates
  Session* s = r.session >= 0 ? sessions_.at(r.session).get() : nullptr;
  if (s && !s->pages.pages().empty()) {  // the kept history cache becomes the turn's
    r.pages = std::move(s->pages);
    s->pages = PageTable();
    r.n_cached = s->n_cached;
    s->n_cached = 0;
  }
  const bool looked_up = prefix_ && r.pages.empty();
  if (looked_up) share_cached_prefix(r);
  *chunk_rows = std::min<int64_t>(budget, r.prefill_end - r.n_cached);
  if (!reserve(r, r.n_cached + *chunk_rows)) {
    if (s && r.n_cached > 0) {  // give the cache back untouched; it stays evictable
      s->pages = std::move(r.pages);
      r.pages = PageTable();
      s->n_cached = r.n_cached;
      r.n_cached = 0;
    }
    if (looked_up) {  // give the cached pages back; the next attempt looks them up again
      keep_tail(r);
      release_pages(r.pages);
      r.n_cached = 0;
    }
    return Admission::kWait;
  }
  if (looked_up) {
    stats_.prefix_cache_queries += r.prefill_end;
    stats_.prefix_cache_hits += r.n_cached;
  }
  if (r.preemptions == 0) r.cached_tokens = int(r.n_cached);
  waiting_.pop_front();
  r.admit_order = next_admit_++;
  running_.push_back(&r);
  return Admission::kAdmitted;
}

// ---- finishing ---------------------------------------------------------------------------------

void Engine::fail(Request& r, ErrorCode code, std::string message) {
  spdlog::warn("engine: request {} failed: {}", r.id, message);
  r.error = code;
  r.message = std::move(message);
  finish(r, FinishReason::kFailed);
}

void Engine::finish(Request& r, FinishReason reason) {
  const bool completed = reason == FinishReason::kStop || reason == FinishReason::kLength;
  if (r.session >= 0) {
    end_turn(r, completed);  // keeps or releases the pages, per the session's policy
  } else {
    keep_tail(r);
    release_pages(r.pages);  // its last audit may still mark r corrupted
  }
  RequestOutput out;
  out.id = r.id;
  out.session = r.session;
  out.tokens.assign(r.seq.begin() + r.prompt_len, r.seq.end());
  out.prompt_tokens = r.prompt_len;
  out.cached_tokens = r.cached_tokens;
  out.reason = reason;
  out.error = r.error;
  out.message = std::move(r.message);
  out.preemptions = r.preemptions;
  out.corrupted = r.corrupted;
  out.findings = std::move(r.findings);
  if (r.admit_order >= 0) {  // admitted requests are running, the others waiting
    std::erase(running_, &r);
  } else {
    std::erase(waiting_, r.id);
  }
  finished_.push_back(std::move(out));
  progress_ = true;
  ++finishes_;
  requests_.erase(r.id);  // r is gone from here on
}

bool Engine::abort(int64_t id) {
  Request* r = find(id);
  if (!r) return false;
  finish(*r, FinishReason::kAborted);
  return true;
}

std::vector<RequestOutput> Engine::take_finished() {
  std::vector<RequestOutput> out;
  out.swap(finished_);
  return out;
}

// ---- steps -------------------------------------------------------------------------------------

bool Engine::step() {
  timer_.start(StepPhase::kSchedule);
  ++stats_.steps;
  progress_ = false;
  new_tokens_.clear();
  const bool prefilled = prefill_step();
  const bool decoded = decode_step();
  stats_.cached_pages = cache_.allocator().cached_pages();
  stats_.seconds.schedule += timer_.take(StepPhase::kSchedule);
  stats_.seconds.post += timer_.take(StepPhase::kPost);
  stats_.seconds.audit += timer_.take(StepPhase::kAudit);
  return prefilled || decoded || progress_;
}

void Engine::run_until_idle() {
  while (!idle()) {
    require(step(), ErrorCode::kInternal,
            "the engine made no progress with {} waiting and {} running requests", waiting_.size(),
            running_.size());
  }
}

RowInput Engine::row_of(const Request& r, int64_t position) const {
  return RowInput{r.seq[size_t(position)], int32_t(position), r.pages.slot(position),
                  int32_t(position + 1), r.pages.pages()};
}

bool Engine::prefill_step() {
  Scratch& w = scratch_;
  w.plan.clear();
  int budget = options_.max_prefill_rows;
  // Requests already prefilling continue first, oldest first. A preemption for room only ever
  // takes a request newer than the one growing, so none already planned. Only r itself can
  // finish in grow(), so the other pointers stay valid.
  w.candidates.assign(running_.begin(), running_.end());
  for (Request* r : w.candidates) {
    if (budget == 0) break;
    if (r->admit_order < 0 || !r->prefilling()) continue;
    const int64_t n = std::min<int64_t>(budget, r->prefill_end - r->n_cached);
    if (!grow(*r, r->n_cached + n)) continue;
    w.plan.push_back({r, r->n_cached, n});
    budget -= int(n);
  }
  while (budget > 0 && !waiting_.empty()) {
    Request* r = find(waiting_.front());
    int64_t n = 0;
    const Admission a = admit(*r, budget, &n);
    if (a == Admission::kFailed) continue;  // it is finished with an error; try the next one
    if (a == Admission::kWait) break;       // no room now: keep the queue's order
    w.plan.push_back({r, r->n_cached, n});
    budget -= int(n);
  }
  if (w.plan.empty()) return false;

  w.rows.clear();
  w.sampling.clear();
  w.owners.clear();
  for (const Scratch::Chunk& c : w.plan) {
    for (int64_t p = c.start; p < c.start + c.count; ++p) {
      w.rows.push_back(row_of(*c.r, p));
      w.sampling.emplace_back();
      w.owners.push_back(c.r);
    }
    // The last prompt row draws the first token; the other rows' (greedy) tokens go unused.
    if (c.start + c.count == c.r->prefill_end) w.sampling.back() = sampling_of(*c.r);
  }
  check_store_targets(w.rows, w.owners);
  // Prefill is never captured.
  timer_.enter(StepPhase::kRunner);
  const StepResult result = runner_->step_eager(w.rows, StepOutputs().with_sampling(w.sampling));
  charge_runner(result);
  ++stats_.prefill_steps;
  stats_.prefill_rows += int64_t(w.rows.size());
  w.batch.clear();
  w.ids.clear();
  for (const Scratch::Chunk& c : w.plan) {
    c.r->n_cached += c.count;
    w.batch.push_back(c.r);
    w.ids.push_back(c.r->id);
  }
  const int64_t finishes = finishes_;
  after_runner_step(w.owners, w.rows, result);  // may fail requests
  forget_finished(w.batch, w.ids, finishes);
  share_written_pages(w.batch);

  size_t row = 0;
  for (size_t i = 0; i < w.plan.size(); ++i) {
    row += size_t(w.plan[i].count);
    Request* r = w.batch[i];
    if (!r || r->prefilling()) continue;      // failed by the step, or more prompt to go
    sample_next(*r, result.tokens[row - 1]);  // the chunk's last row
  }
  return true;
}

bool Engine::decode_step() {
  timer_.enter(StepPhase::kSchedule);
  Scratch& w = scratch_;
  w.batch.clear();
  // grow() may preempt newer requests (they stay alive, unadmitted) or fail r itself.
  w.candidates.assign(running_.begin(), running_.end());
  for (Request* r : w.candidates) {
    if (r->admit_order < 0 || r->prefilling()) continue;
    if (!grow(*r, r->n_cached + 1)) continue;
    w.batch.push_back(r);
  }
  if (w.batch.empty()) return false;
  w.rows.clear();
  w.sampling.clear();
  for (Request* r : w.batch) {
    w.rows.push_back(row_of(*r, r->n_cached));
    w.sampling.push_back(sampling_of(*r));
  }
  check_store_targets(w.rows, w.batch);
  timer_.enter(StepPhase::kRunner);
  const StepResult result = runner_->step(w.rows, StepOutputs().with_sampling(w.sampling));
  charge_runner(result);
  ++stats_.decode_steps;
  stats_.decode_rows += int64_t(w.rows.size());
  if (result.bucket > 0) {
    stats_.padded_rows += result.bucket - int64_t(w.rows.size());
    ++stats_.graph_replays[result.bucket];
  }
  w.ids.clear();
  for (Request* r : w.batch) {
    ++r->n_cached;
    w.ids.push_back(r->id);
  }
  const int64_t finishes = finishes_;
  after_runner_step(w.batch, w.rows, result);  // may fail requests
  forget_finished(w.batch, w.ids, finishes);
  share_written_pages(w.batch);
  for (size_t i = 0; i < w.batch.size(); ++i) {
    if (Request* r = w.batch[i]) sample_next(*r, result.tokens[i]);
  }
  return true;
}

// After a call that may have finished some of a step's requests (their pointers dangle then):
// each entry becomes the request with that id again, or null when it is gone.
void Engine::forget_finished(std::span<Request*> requests, std::span<const int64_t> ids,
                             int64_t finishes_before) {
  if (finishes_ == finishes_before) return;
  for (size_t i = 0; i < requests.size(); ++i) requests[i] = find(ids[i]);
}

// The runner call's wall time is the runner's stage, launch and wait, and reading the results back
// (post).
void Engine::charge_runner(const StepResult& result) {
  timer_.enter(StepPhase::kPost);
  const double runner = timer_.take(StepPhase::kRunner);
  const double stage = result.stage_us * 1e-6, launch = result.launch_us * 1e-6,
               wait = result.wait_us * 1e-6;
  stats_.seconds.stage += stage;
  stats_.seconds.launch += launch;
  stats_.seconds.device_wait += wait;
  stats_.seconds.post += std::max(0.0, runner - stage - launch - wait);
}

RowSampling Engine::sampling_of(const Request& r) const {
  return {r.params.sampling, uint64_t(r.generated())};
}

void Engine::sample_next(Request& r, int32_t token) {
  r.seq.push_back(token);
  new_tokens_.push_back({r.id, token});
  ++stats_.generated_tokens;
  if (r.params.stop_token >= 0 && token == r.params.stop_token) {
    finish(r, FinishReason::kStop);
  } else if (r.generated() >= r.params.max_new_tokens) {
    finish(r, FinishReason::kLength);
  }
}

// ---- the auditor -------------------------------------------------------------------------------

void Engine::after_runner_step(const std::vector<Request*>& row_owners,
                               const std::vector<RowInput>& rows, const StepResult& result) {
  stats_.store_errors += result.store_errors;
  ++runner_steps_;
  if (auditor_ || oracle_) {
    const PhaseScope scope(timer_, StepPhase::kAudit);
    std::vector<int64_t> slots, owners;
    slots.reserve(rows.size());
    owners.reserve(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      slots.push_back(rows[i].slot);
      owners.push_back(owner_of(*row_owners[i]));
    }
    // The slots the real rows wrote get their truth from what the rows meant to write, so a slot
    // clobbered in this very step (a stale row writing after the real one) is a finding too.
    if (auditor_) auditor_->record_written(slots, owners, result.write_digests, runner_steps_);
    if (oracle_) {
      oracle_->write(slots, owners, result.store_values);
      recall_.saw_clobbers(oracle_->compare(runner_steps_));
      stats_.oracle_clobbers = recall_.oracle_clobbers();
    }
    if (auditor_) {
      std::vector<Request*> readers(row_owners);
      readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
      audit(readers);
    }
  }
  if (result.store_errors > 0) fail_for_store_errors(row_owners, rows, result);
}

// The step's error flag (DESIGN §3): never silent. The requests whose rows the store rejected
// fail with the step and rows named; when no real row's slot explains the flag (a padded row,
// or a page id the kernels refused), every request of the step does.
void Engine::fail_for_store_errors(const std::vector<Request*>& row_owners,
                                   const std::vector<RowInput>& rows, const StepResult& result) {
  std::vector<int> culprits = result.error_rows;
  if (culprits.empty()) {
    for (size_t i = 0; i < rows.size(); ++i) culprits.push_back(int(i));
  }
  std::vector<std::string> described;
  for (int i : culprits) described.push_back(fmt::format("{} (slot {})", i, rows[size_t(i)].slot));
  const std::string what = fmt::format(
      "runner step {} raised its error flag {} time(s) (a slot the store contract rejects, or a "
      "page id outside the pool); {} rows: {}",
      runner_steps_, result.store_errors,
      result.error_rows.empty() ? "unexplained, failing all" : "rejected",
      fmt::join(described, ", "));
  spdlog::error("engine: {}", what);
  std::vector<int64_t> ids;
  for (int i : culprits) ids.push_back(row_owners[size_t(i)]->id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int64_t id : ids) {
    Request* r = find(id);
    if (!r) continue;
    ++stats_.failed_by_store_errors;
    fail(*r, ErrorCode::kInternal,
         fmt::format("request {}: its cache is incomplete: {}", id, what));
  }
}

void Engine::audit(const std::vector<Request*>& readers) {
  std::vector<AuditFinding> findings;
  switch (options_.audit_scope) {
    case AuditScope::kAll:
      findings = auditor_->verify_all(runner_steps_);
      break;
    case AuditScope::kListed: {
      std::vector<int64_t> read;  // every slot the step's rows attended over
      for (const Request* r : readers) {
        for (int64_t p = 0; p < r->n_cached; ++p) read.push_back(r->pages.slot(p));
      }
      findings = auditor_->verify(read, runner_steps_);
      break;
    }
    case AuditScope::kSample:
      findings = auditor_->verify_sample(options_.audit_sample, options_.audit_seed, runner_steps_);
      break;
  }
  report_findings(std::move(findings));
}

void Engine::report_findings(std::vector<AuditFinding> findings) {
  if (findings.empty()) return;
  std::vector<int64_t> slots;
  for (AuditFinding& f : findings) {
    if (f.owner == kPrefixCacheOwner) f.sharers = sharers_of(int32_t(f.slot / kPageSize));
    mark_corrupted(f);
    slots.push_back(f.slot);
  }
  if (oracle_) {
    recall_.saw_findings(findings);
    stats_.auditor_found = recall_.auditor_found();
    stats_.auditor_unconfirmed = recall_.auditor_unconfirmed();
  }
  // Report each change once: the changed contents become the slot's truth.
  auditor_->accept_current(slots, runner_steps_);
}

void Engine::mark_corrupted(const AuditFinding& f) {
  ++stats_.audit_findings;
  spdlog::debug("engine: auditor: {}", f.describe());
  if (f.owner != kPrefixCacheOwner) return mark_owner(f.owner, f);
  // A clobbered cached page: everyone sharing it read it, and no one may find it again.
  for (int64_t owner : f.sharers) mark_owner(owner, f);
  prefix_->poison(int32_t(f.slot / kPageSize));
}

void Engine::mark_owner(int64_t owner, const AuditFinding& f) {
  auto s = sessions_.find(owner);
  Request* r = nullptr;
  if (s != sessions_.end()) {
    SessionState& st = s->second->state;
    if (!st.corrupted) st.first_corrupted_turn = st.turns;
    st.corrupted = true;
    st.findings.push_back(f);
    r = st.active_request >= 0 ? find(st.active_request) : nullptr;
  } else {
    r = find(owner);
  }
  if (r) {
    r->corrupted = true;
    r->findings.push_back(f);
  }
}

}  // namespace dsa
