// The page allocator of DESIGN §2 and §8: page ids in [1, total), page 0 reserved, and exact
// accounting over three states (free, owned by one request, held by the prefix cache).
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "dsa/cache.h"
#include "dsa/error.h"

namespace dsa {

const char* page_state_name(PageState s) {
  switch (s) {
    case PageState::kFree:
      return "free";
    case PageState::kOwned:
      return "owned";
    case PageState::kCached:
      return "cached";
  }
  return "?";
}

PageAllocator::PageAllocator(int64_t total_pages) : total_(total_pages) {
  require(total_pages >= 2, ErrorCode::kInvalidArgument,
          "page allocator needs total_pages >= 2 (page 0 is reserved), got {}", total_pages);
  // Page ids are int32 page-table entries, so the largest id must fit.
  constexpr int64_t kMaxPages = int64_t(std::numeric_limits<int32_t>::max()) + 1;
  require(total_pages <= kMaxPages, ErrorCode::kInvalidArgument,
          "page allocator total_pages {} exceeds the int32 page-id limit {}", total_pages,
          kMaxPages);
  // A stack whose top is page 1: a fresh allocator hands out 1, 2, 3, ...
  free_list_.reserve(size_t(total_pages - 1));
  for (int64_t page = total_pages - 1; page >= 1; --page) free_list_.push_back(int32_t(page));
  state_.assign(size_t(total_pages), PageState::kFree);
}

std::optional<int32_t> PageAllocator::allocate() {
  if (free_list_.empty()) return std::nullopt;
  const int32_t page = free_list_.back();
  free_list_.pop_back();
  state_[size_t(page)] = PageState::kOwned;
  ++used_;
  return page;
}

bool PageAllocator::allocate_n(int64_t n, std::vector<int32_t>& out) {
  require(n >= 0, ErrorCode::kInvalidArgument, "allocate_n of {} pages: the count must be >= 0", n);
  if (n > free_pages()) return false;  // all-or-nothing: take none
  out.reserve(out.size() + size_t(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(*allocate());
  return true;
}

void PageAllocator::check_page(int32_t page, const char* what) const {
  require(page != kReservedPage, ErrorCode::kInvalidArgument,
          "{} of page {}: the reserved page is never allocated", what, page);
  require(page > 0 && page < total_, ErrorCode::kInvalidArgument,
          "{} of page {}: outside the allocator's pages [1, {})", what, page, total_);
}

PageState PageAllocator::state(int32_t page) const {
  check_page(page, "state");
  return state_[size_t(page)];
}

void PageAllocator::move(int32_t page, PageState from, PageState to, const char* what) {
  check_page(page, what);
  const PageState now = state_[size_t(page)];
  if (now != from) {
    fail(ErrorCode::kInvalidArgument, "{} of page {}: the page is {}, not {}{}", what, page,
         page_state_name(now), page_state_name(from),
         now == PageState::kFree ? " (double free)" : "");
  }
  state_[size_t(page)] = to;
  used_ += (to == PageState::kOwned) - (from == PageState::kOwned);
  cached_ += (to == PageState::kCached) - (from == PageState::kCached);
  if (to == PageState::kFree) free_list_.push_back(page);
}

void PageAllocator::release(int32_t page) {
  move(page, PageState::kOwned, PageState::kFree, "release");
}

void PageAllocator::to_cached(int32_t page) {
  move(page, PageState::kOwned, PageState::kCached, "to_cached");
}

void PageAllocator::release_cached(int32_t page) {
  move(page, PageState::kCached, PageState::kFree, "release_cached");
}

void PageAllocator::to_owned(int32_t page) {
  move(page, PageState::kCached, PageState::kOwned, "to_owned");
}

}  // namespace dsa
