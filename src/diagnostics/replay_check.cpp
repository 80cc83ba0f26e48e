// The randomized replay check. Sequences ("requests") start, grow one token per step and finish
// at random, so batches grow and shrink across buckets and freed pages are soon handed to new
// requests: exactly the conditions under which a stale padded row can clobber a live token.
#include "dsa/replay_check.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "dsa/error.h"
#include "dsa/shadow_oracle.h"

namespace dsa {
namespace {

struct Sequence {
  int64_t id;
  int32_t next_token;
  int32_t length = 0;  // tokens stored so far
  int32_t target;      // finishes at this length
  PageTable pages;     // in the graph cache
  PageTable twin;      // the same page ids, in the eager twin cache
};

}  // namespace

int ReplayCheckReport::diverged_not_flagged() const {
  return int(std::count_if(diverged.begin(), diverged.end(),
                           [this](int64_t id) { return !victims.count(id); }));
}

int ReplayCheckReport::flagged_and_diverged() const {
  return int(std::count_if(victims.begin(), victims.end(),
                           [this](int64_t id) { return diverged.count(id) != 0; }));
}

ReplayCheckReport run_replay_check(Model& model, const CacheConfig& cache_config,
                                   const ReplayCheckOptions& o) {
  Backend& be = model.backend();
  require(o.steps >= 1, ErrorCode::kInvalidArgument, "steps = {} must be >= 1", o.steps);
  require(o.max_request_tokens >= 2 && o.max_request_tokens <= model.max_context(),
          ErrorCode::kInvalidArgument, "max_request_tokens = {} must be in [2, {}]",
          o.max_request_tokens, model.max_context());
  KvCache cache(be, cache_config);
  KvCache twin(be, cache_config);
  ReplayCheckReport report;
  report.oracle = o.faults.any();
  RunnerOptions graph_options{o.mode, o.buckets, o.faults, WriteDigests::kOn,
                              report.oracle ? WriteValues::kOn : WriteValues::kOff};
  Runner graph(model, cache, graph_options);
  Runner eager(model, twin, RunnerOptions{RunMode::kEager, {}, {}});
  SlotAuditor auditor(be, cache);
  std::unique_ptr<ShadowOracle> oracle;
  if (report.oracle) oracle = std::make_unique<ShadowOracle>(be, cache);
  RecallTally recall;

  std::mt19937_64 rng(o.seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int vocab = model.config().vocab_size;
  const int widest = o.mode == RunMode::kGraph && !o.buckets.empty()
                         ? *std::max_element(o.buckets.begin(), o.buckets.end())
                         : model.max_rows();
  const int max_batch = std::min(o.max_live_requests, widest);
  const int topk = model.config().index_topk;
  std::vector<Sequence> live;
  int64_t next_id = 1;
  int step = 0;

  // A finding is reported once: its slot's current bytes become the truth.
  auto report_findings = [&](const std::vector<AuditFinding>& found) {
    std::vector<int64_t> slots;
    for (const AuditFinding& f : found) {
      report.victims.insert(f.owner);
      report.findings.push_back(f);
      slots.push_back(f.slot);
    }
    recall.saw_findings(found);
    auditor.accept_current(slots, step);
  };
  auto release = [&](Sequence& s) {
    std::vector<int64_t> slots;
    for (int32_t t = 0; t < s.length; ++t) slots.push_back(s.pages.slot(t));
    report_findings(auditor.verify(slots, step));  // a last look before they are forgotten
    auditor.forget(slots);
    if (oracle) oracle->forget(slots);
    recall.released(slots);
    s.pages.release_all(cache.allocator());
    s.twin.release_all(twin.allocator());
  };

  for (; step < o.steps; ++step) {
    // Batches wander: pick a target size, finish some sequences, start new ones to approach it.
    const int target = int(uniform(1, max_batch));
    for (size_t i = 0; i < live.size();) {
      const bool long_lived = live[i].target > topk && live[i].length < live[i].target;
      const bool done = live[i].length >= live[i].target ||
                        (!long_lived && (std::bernoulli_distribution(o.finish_probability)(rng) ||
                                         int(live.size()) > target + int(uniform(0, 2))));
      if (done) {
        release(live[i]);
        live.erase(live.begin() + i);
      } else {
        ++i;
      }
    }
    int long_now = int(std::count_if(live.begin(), live.end(),
                                     [topk](const Sequence& q) { return q.target > topk; }));
    while (int(live.size()) < target) {
      const bool make_long = long_now < o.long_live && o.max_request_tokens > topk;
      long_now += make_long;
      const int32_t length =
          int32_t(make_long ? uniform(topk + 1, o.max_request_tokens)
                            : uniform(2, std::max(2, std::min(topk, o.max_request_tokens))));
      report.long_sequences += make_long;
      Sequence s{next_id++, int32_t(uniform(0, vocab - 1)), 0, length, {}, {}};
      live.push_back(std::move(s));
    }
    // Every live sequence stores one more token this step; a sequence that cannot get a page
    // finishes instead (the engine would preempt it).
    std::vector<RowInput> rows;
    std::vector<int64_t> owners;
    for (size_t i = 0; i < live.size();) {
      Sequence& s = live[i];
      const bool ok = s.pages.reserve(s.length + 1, cache.allocator()) &&
                      s.twin.reserve(s.length + 1, twin.allocator());
      if (!ok || s.pages.pages() != s.twin.pages()) {
        release(s);
        live.erase(live.begin() + i);
        continue;
      }
      rows.push_back(
          {s.next_token, s.length, s.pages.slot(s.length), s.length + 1, s.pages.pages()});
      owners.push_back(s.id);
      ++i;
    }
    if (rows.empty()) continue;

    StepResult g = graph.step(rows);
    report.bucket_histogram[g.bucket]++;
    report.store_errors += g.store_errors;
    std::vector<int64_t> written;
    for (const RowInput& r : rows) written.push_back(r.slot);
    auditor.record_written(written, owners, g.write_digests, step);
    if (oracle) {
      oracle->write(written, owners, g.store_values);
      recall.saw_clobbers(oracle->compare(step));
    }
    if (o.parity) {
      StepResult e = eager.step_eager(rows);
      const size_t row_floats = size_t(vocab);
      bool mismatch = e.logits.size() != g.logits.size();
      for (size_t r = 0; r < rows.size() && e.logits.size() == g.logits.size(); ++r) {
        if (std::memcmp(e.logits.data() + r * row_floats, g.logits.data() + r * row_floats,
                        row_floats * sizeof(float)) != 0) {
          report.diverged.insert(owners[r]);  // per request: which victims' logits changed
          mismatch = true;
        }
      }
      if (mismatch && report.parity_mismatches++ == 0) report.first_parity_mismatch_step = step;
    }
    // Audit: a sample each step, everything now and then, and each sequence at its release.
    report_findings((o.full_audit_every > 0 && (step + 1) % o.full_audit_every == 0) ||
                            step + 1 == o.steps
                        ? auditor.verify_all(step)
                        : auditor.verify_sample(o.audit_sample, o.seed, step));
    // Next tokens: greedy from the graph runner's logits (any deterministic choice works).
    for (size_t r = 0; r < rows.size(); ++r) {
      Sequence& s = live[r];
      const float* l = g.logits.data() + r * size_t(vocab);
      s.next_token = int32_t(std::max_element(l, l + vocab) - l);
      ++s.length;
    }
    report.tokens += int64_t(rows.size());
    report.steps = step + 1;
    if (o.progress && (step % 50 == 0 || step + 1 == o.steps)) o.progress(step + 1, o.steps);
  }
  for (Sequence& s : live) release(s);
  report.audited_slots = auditor.audited_slots();
  report.oracle_clobbers = recall.oracle_clobbers();
  report.auditor_found = recall.auditor_found();
  report.auditor_unconfirmed = recall.auditor_unconfirmed();
  return report;
}

}  // namespace dsa
