// The page allocator of DESIGN §2: page ids in [1, total), page 0 reserved, exact accounting.
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "dsa/cache.h"
#include "dsa/error.h"

namespace dsa {

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
  in_use_.assign(size_t(total_pages), 0);
}

std::optional<int32_t> PageAllocator::allocate() {
  if (free_list_.empty()) return std::nullopt;
  const int32_t page = free_list_.back();
  free_list_.pop_back();
  in_use_[size_t(page)] = 1;
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

void PageAllocator::release(int32_t page) {
  require(page != kReservedPage, ErrorCode::kInvalidArgument,
          "release of page {}: the reserved page is never allocated", page);
  require(page > 0 && page < total_, ErrorCode::kInvalidArgument,
          "release of page {}: outside the allocator's pages [1, {})", page, total_);
  require(in_use_[size_t(page)] != 0, ErrorCode::kInvalidArgument,
          "release of page {}: the page is not in use (double free)", page);
  in_use_[size_t(page)] = 0;
  free_list_.push_back(page);
  --used_;
}

}  // namespace dsa
