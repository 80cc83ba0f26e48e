// The engine's side of the prefix cache (DESIGN §8): finding a request's cached prefix at
// admission, sharing the pages it has filled, evicting for room, the host-side store check before
// every step, and the page accounting check.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>

#include "dsa/engine.h"
#include "engine_state.h"

namespace dsa {
namespace {

std::vector<int64_t> page_slots(int32_t page) {
  std::vector<int64_t> slots(kPageSize);
  for (int i = 0; i < kPageSize; ++i) slots[size_t(i)] = int64_t(page) * kPageSize + i;
  return slots;
}

std::vector<int64_t> pages_slots(std::span<const int32_t> pages) {
  std::vector<int64_t> slots;
  slots.reserve(pages.size() * kPageSize);
  for (int32_t page : pages) {
    for (int i = 0; i < kPageSize; ++i) slots.push_back(int64_t(page) * kPageSize + i);
  }
  return slots;
}

}  // namespace

// Frees at least n unreferenced cached pages (least recently used first). False when there were
// none to free.
bool Engine::evict_cached_pages(int64_t n) {
  if (!prefix_) return false;
  std::vector<int32_t> freed;
  if (prefix_->evict(std::max<int64_t>(n, 1), freed) == 0) return false;
  unwatch(freed);
  stats_.prefix_cache_evictions += int64_t(freed.size());
  return true;
}

int64_t Engine::drop_cached_pages() {
  const int64_t before = cache_.allocator().cached_pages();
  while (evict_cached_pages(before)) {
  }
  return before - cache_.allocator().cached_pages();
}

// At admission, for a request with no pages: shares the cached pages of its longest cached prefix
// of whole pages, then the tail it continues furthest (PrefixCache::match_tail), leaving at least
// its last token to prefill (its logits are needed). Every page reused is verified by the auditor
// first; a changed page is reported (naming everyone sharing it), poisoned, and the request takes
// only the pages before it (and no tail).
void Engine::share_cached_prefix(Request& r) {
  const int64_t max_pages = (r.prefill_end - 1) / kPageSize;
  std::vector<int32_t> pages = prefix_->match(r.seq, std::max<int64_t>(max_pages, 0));
  bool intact = true;
  if (auditor_ && !pages.empty()) {
    const PhaseScope scope(timer_, StepPhase::kAudit);
    std::vector<AuditFinding> findings = auditor_->verify(pages_slots(pages), runner_steps_);
    if (!findings.empty()) {
      int64_t first_bad = int64_t(pages.size());
      for (const AuditFinding& f : findings) first_bad = std::min(first_bad, f.slot / kPageSize);
      const auto bad = std::find(pages.begin(), pages.end(), int32_t(first_bad));
      spdlog::warn(
          "engine: cached page {} changed since it was written; request {} recomputes "
          "from token {}",
          first_bad, r.id, (bad - pages.begin()) * kPageSize);
      report_findings(std::move(findings));
      pages.erase(bad, pages.end());
      intact = false;
    }
  }
  prefix_->share(pages, r.pages);
  r.n_cached = int64_t(pages.size()) * kPageSize;
  if (!intact) return;

  const PrefixCache::TailMatch tail =
      prefix_->match_tail(r.seq, pages, r.prefill_end - 1 - r.n_cached);
  if (!tail.page) return;
  if (auditor_) {
    const PhaseScope scope(timer_, StepPhase::kAudit);
    std::vector<AuditFinding> findings = auditor_->verify(page_slots(tail.page), runner_steps_);
    if (!findings.empty()) {  // reported and poisoned; the request prefills those tokens itself
      report_findings(std::move(findings));
      return;
    }
  }
  prefix_->take_tail(tail.page, r.pages);
  if (auditor_) auditor_->adopt(page_slots(tail.page), owner_of(r));
  r.n_cached += tail.tokens;
}

// Before a request's pages are released: its last, partly filled page stays in the prefix cache
// as a tail when it is intact (verified now: the release would have verified it too), for the
// next turn of its conversation to continue.
void Engine::keep_tail(Request& r) {
  if (!prefix_ || r.corrupted) return;
  const int32_t page = PrefixCache::tail_page(r.n_cached, r.pages);
  if (!page) return;
  if (auditor_) {
    const PhaseScope scope(timer_, StepPhase::kAudit);
    report_findings(auditor_->verify(page_slots(page), runner_steps_));
    if (r.corrupted) return;
  }
  std::vector<int32_t> freed;
  if (!prefix_->keep_tail(r.seq, r.prompt_len, r.n_cached, r.pages, freed)) return;
  if (!freed.empty()) {
    unwatch(freed);
    stats_.prefix_cache_evictions += int64_t(freed.size());
  }
  if (auditor_) auditor_->adopt(page_slots(page), kPrefixCacheOwner);
}

// After a runner step: every page of these requests that is now full (all 64 tokens written)
// joins the prefix cache. A page identical to one already cached is swapped for it, and the
// request's copy is freed; the reused page is verified like any hit.
void Engine::share_written_pages(std::span<Request* const> requests) {
  if (!prefix_) return;
  for (Request* r : requests) {
    if (!r) continue;  // the step failed it
    while (r->pages.shared_pages() < r->n_cached / kPageSize) {
      const PrefixCache::InsertResult ins = prefix_->insert_next(r->seq, r->pages);
      if (ins.outcome == PrefixCache::Insert::kRefused) break;
      if (ins.outcome == PrefixCache::Insert::kSwapped) unwatch(std::span(&ins.freed, 1));
      if (!auditor_) continue;
      const PhaseScope scope(timer_, StepPhase::kAudit);
      if (ins.outcome == PrefixCache::Insert::kInserted) {
        auditor_->adopt(page_slots(ins.page), kPrefixCacheOwner);
      } else {  // a reuse, verified like any hit; the request itself now shares it and is named
        report_findings(auditor_->verify(page_slots(ins.page), runner_steps_));
      }
    }
  }
}

// DESIGN §8: no store of the step targets a page that is cached (shared or not), free, or
// otherwise not owned by exactly one request. Cheap (one state lookup per row), so always on.
void Engine::check_store_targets(std::span<const RowInput> rows, std::span<Request* const> owners) {
  std::vector<int64_t>& slots = scratch_.slots;
  slots.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) slots[i] = rows[i].slot;
  const int64_t bad = first_unwritable_slot(cache_.allocator(), slots);
  if (bad < 0) return;
  const RowInput& row = rows[size_t(bad)];
  const int32_t page = int32_t(row.slot / kPageSize);
  dsa::fail(ErrorCode::kInternal,
            "store check: row {} of request {} (position {}) would write slot {} in page {}, which "
            "is {} with {} references; a request may write only pages it owns alone",
            bad, owners[size_t(bad)]->id, row.position, row.slot, page,
            page_state_name(cache_.allocator().state(page)), prefix_ ? prefix_->refcount(page) : 0);
}

// Every request and session whose page table shares `page` (owner ids, as the auditor names them).
std::vector<int64_t> Engine::sharers_of(int32_t page) const {
  std::set<int64_t> out;
  auto shares = [page](const PageTable& t) {
    const auto& p = t.pages();
    return std::find(p.begin(), p.begin() + t.shared_pages(), page) != p.begin() + t.shared_pages();
  };
  for (const auto& [id, r] : requests_) {
    if (shares(r->pages)) out.insert(owner_of(*r));
  }
  for (const auto& [id, s] : sessions_) {
    if (shares(s->pages)) out.insert(id);
  }
  return {out.begin(), out.end()};
}

void Engine::check_page_accounting() const {
  const PageAllocator& a = cache_.allocator();
  auto broken = [](bool ok, const std::string& what) {
    require(ok, ErrorCode::kInternal, "page accounting broken: {}", what);
  };
  broken(a.free_pages() + a.used_pages() + a.cached_pages() == a.total_pages() - 1,
         fmt::format("free {} + used {} + cached {} != total {} - 1", a.free_pages(),
                     a.used_pages(), a.cached_pages(), a.total_pages()));
  std::set<int32_t> owned;
  std::map<int32_t, int32_t> shared;  // page -> tables sharing it
  auto count = [&](const PageTable& t) {
    const auto& p = t.pages();
    for (size_t j = 0; j < p.size(); ++j) {
      if (int64_t(j) < t.shared_pages()) {
        ++shared[p[j]];
      } else {
        broken(owned.insert(p[j]).second, fmt::format("page {} is owned by two tables", p[j]));
        broken(a.state(p[j]) == PageState::kOwned,
               fmt::format("page {} is in a table but {}", p[j], page_state_name(a.state(p[j]))));
      }
    }
  };
  for (const auto& [id, r] : requests_) count(r->pages);
  for (const auto& [id, s] : sessions_) count(s->pages);
  broken(int64_t(owned.size()) == a.used_pages(),
         fmt::format("{} pages owned by tables, {} used in the allocator", owned.size(),
                     a.used_pages()));
  if (!prefix_) {
    broken(shared.empty() && a.cached_pages() == 0, "shared pages without a prefix cache");
    return;
  }
  int64_t references = 0;
  for (const auto& [page, n] : shared) {
    broken(prefix_->refcount(page) == n,
           fmt::format("page {} is shared by {} tables but has {} references", page, n,
                       prefix_->refcount(page)));
    references += n;
  }
  broken(references == prefix_->references(),
         fmt::format("{} references from tables, {} in the prefix cache", references,
                     prefix_->references()));
  prefix_->check_invariants();
}

}  // namespace dsa
