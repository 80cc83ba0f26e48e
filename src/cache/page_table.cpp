// Per-request page tables: token t of a request lives at slot pages[t / 64] * 64 + t % 64. A
// table's first shared_pages() pages are prefix-cache pages it only reads.
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
  require(shared_ == 0, ErrorCode::kInvalidArgument,
          "page table with {} shared prefix-cache pages released without the prefix cache",
          shared_);
  release_owned(allocator);
}

void PageTable::release_owned(PageAllocator& allocator) {
  for (size_t i = size_t(shared_); i < pages_.size(); ++i) allocator.release(pages_[i]);
  pages_.resize(size_t(shared_));
}

void PageTable::append_shared(int32_t page) {
  require(shared_ == int64_t(pages_.size()), ErrorCode::kInvalidArgument,
          "a shared page appended after {} owned pages", int64_t(pages_.size()) - shared_);
  pages_.push_back(page);
  ++shared_;
}

int32_t PageTable::share_next(int32_t page) {
  require(shared_ < int64_t(pages_.size()), ErrorCode::kInvalidArgument,
          "share_next: the table's {} pages are all shared already", pages_.size());
  const int32_t old = pages_[size_t(shared_)];
  pages_[size_t(shared_++)] = page;
  return old;
}

int32_t PageTable::take_first_owned() {
  require(shared_ < int64_t(pages_.size()), ErrorCode::kInvalidArgument,
          "take_first_owned: the table's {} pages are all shared", pages_.size());
  const int32_t page = pages_[size_t(shared_)];
  pages_.erase(pages_.begin() + shared_);
  return page;
}

void PageTable::append_owned(int32_t page) { pages_.push_back(page); }

std::vector<int32_t> PageTable::take_shared() {
  require(shared_ == int64_t(pages_.size()), ErrorCode::kInvalidArgument,
          "take_shared with {} owned pages still in the table", int64_t(pages_.size()) - shared_);
  std::vector<int32_t> out;
  out.swap(pages_);
  shared_ = 0;
  return out;
}

int64_t PageTable::slot(int64_t position) const {
  require(position >= 0 && position < capacity_tokens(), ErrorCode::kOutOfRange,
          "token position {} is outside the page table's {} reserved tokens", position,
          capacity_tokens());
  return int64_t(pages_[size_t(position / kPageSize)]) * kPageSize + position % kPageSize;
}

}  // namespace dsa
