// Per-request page tables: token t of a request lives at slot pages[t / 64] * 64 + t % 64.
#include <cstdint>
#include <vector>

#include "dsa/cache.h"
#include "dsa/error.h"

namespace dsa {

bool PageTable::reserve(int64_t n_tokens, PageAllocator& allocator) {
  require(n_tokens >= 0, ErrorCode::kInvalidArgument,
          "page table reserve of {} tokens: the count must be >= 0", n_tokens);
  const int64_t pages_needed = (n_tokens + kPageSize - 1) / kPageSize;
  const int64_t missing = pages_needed - int64_t(pages_.size());
  if (missing <= 0) return true;
  // allocate_n is all-or-nothing, so on exhaustion neither the table nor the allocator changes.
  std::vector<int32_t> fresh;
  if (!allocator.allocate_n(missing, fresh)) return false;
  pages_.insert(pages_.end(), fresh.begin(), fresh.end());
  return true;
}

void PageTable::release_all(PageAllocator& allocator) {
  for (const int32_t page : pages_) allocator.release(page);
  pages_.clear();
}

int64_t PageTable::slot(int64_t position) const {
  require(position >= 0 && position < capacity_tokens(), ErrorCode::kOutOfRange,
          "token position {} is outside the page table's {} reserved tokens", position,
          capacity_tokens());
  return int64_t(pages_[size_t(position / kPageSize)]) * kPageSize + position % kPageSize;
}

}  // namespace dsa
