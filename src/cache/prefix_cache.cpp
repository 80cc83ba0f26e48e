// The prefix cache: a hash chain of full pages with reference counts and a least-recently-used
// list of the unreferenced ones (see include/cache/dsa/prefix_cache.h for the invariants).
#include "dsa/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "dsa/error.h"

namespace dsa {
namespace {

uint64_t page_key(uint64_t parent_serial, std::span<const int32_t> page_tokens) {
  return XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), parent_serial);
}

}  // namespace

int64_t first_unwritable_slot(const PageAllocator& allocator, std::span<const int64_t> slots) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] == kPadSlot) continue;
    if (slots[i] < kPageSize || !allocator.owned(slots[i] / kPageSize)) return int64_t(i);
  }
  return -1;
}

PrefixCache::PrefixCache(PageAllocator& allocator) : allocator_(allocator) {}

PrefixCache::~PrefixCache() = default;

const PrefixCache::Node* PrefixCache::find_child(uint64_t parent_serial,
                                                 std::span<const int32_t> page_tokens) const {
  auto it = index_.find(page_key(parent_serial, page_tokens));
  if (it == index_.end()) return nullptr;
  const Node& n = nodes_.at(it->second);
  // The hash only finds the candidate; the parent and the tokens decide.
  if (n.parent_serial != parent_serial ||
      !std::equal(n.tokens.begin(), n.tokens.end(), page_tokens.begin())) {
    return nullptr;
  }
  return &n;
}

std::vector<int32_t> PrefixCache::match(std::span<const int32_t> tokens, int64_t max_pages) const {
  std::vector<int32_t> pages;
  const int64_t n = std::min<int64_t>(max_pages, int64_t(tokens.size()) / kPageSize);
  uint64_t parent = 0;
  for (int64_t j = 0; j < n; ++j) {
    const Node* node = find_child(parent, tokens.subspan(size_t(j * kPageSize), kPageSize));
    if (!node) break;
    pages.push_back(node->page);
    parent = node->serial;
  }
  return pages;
}

void PrefixCache::share(std::span<const int32_t> pages, PageTable& table) {
  require(table.empty(), ErrorCode::kInvalidArgument,
          "prefix cache: shared pages go only into an empty table, this one has {} pages",
          table.pages().size());
  int32_t parent = 0;
  for (int32_t page : pages) {
    auto it = nodes_.find(page);
    require(it != nodes_.end() && it->second.parent == parent && !it->second.poisoned,
            ErrorCode::kInvalidArgument, "prefix cache: page {} is not a live match", page);
    Node& n = it->second;
    if (n.refs++ == 0) lru_.erase(n.lru);
    ++references_;
    table.append_shared(page);
    parent = page;
  }
}

PrefixCache::InsertResult PrefixCache::insert_next(std::span<const int32_t> tokens,
                                                   PageTable& table) {
  const int64_t j = table.shared_pages();
  require(j < int64_t(table.pages().size()) && int64_t(tokens.size()) >= (j + 1) * kPageSize,
          ErrorCode::kInvalidArgument,
          "prefix cache: page {} of a table of {} pages holding {} tokens is not full", j,
          table.pages().size(), tokens.size());
  const std::span<const int32_t> page_tokens = tokens.subspan(size_t(j * kPageSize), kPageSize);
  const int32_t parent = j > 0 ? table.pages()[size_t(j - 1)] : 0;
  const Node* parent_node = parent ? &nodes_.at(parent) : nullptr;
  if (parent_node && parent_node->poisoned) return {};
  const uint64_t parent_serial = parent_node ? parent_node->serial : 0;

  InsertResult result;
  if (const Node* same = find_child(parent_serial, page_tokens)) {
    // Another request wrote the same prefix first: share its page and free ours.
    Node& n = nodes_.at(same->page);
    if (n.refs++ == 0) lru_.erase(n.lru);
    ++references_;
    result.outcome = Insert::kSwapped;
    result.page = n.page;
    result.freed = table.share_next(n.page);
    allocator_.release(result.freed);
    return result;
  }
  const uint64_t key = page_key(parent_serial, page_tokens);
  if (index_.count(key)) return {};  // a hash collision with another prefix: keep the page owned

  const int32_t page = table.pages()[size_t(j)];
  allocator_.to_cached(page);  // throws unless the table owned it
  table.share_next(page);
  Node& n = nodes_[page];
  n.page = page;
  n.serial = next_serial_++;
  n.key = key;
  n.parent = parent;
  n.parent_serial = parent_serial;
  n.tokens.assign(page_tokens.begin(), page_tokens.end());
  n.refs = 1;
  ++references_;
  n.indexed = true;
  index_[key] = page;
  if (parent) nodes_.at(parent).children.push_back(page);
  result.outcome = Insert::kInserted;
  result.page = page;
  return result;
}

void PrefixCache::unref(int32_t page) {
  Node& n = nodes_.at(page);
  require(n.refs > 0, ErrorCode::kInternal, "prefix cache: page {} released more than taken", page);
  --references_;
  if (--n.refs > 0) return;
  // A poisoned page goes to the front: it is the first to be evicted.
  n.lru = n.poisoned ? lru_.insert(lru_.begin(), page) : lru_.insert(lru_.end(), page);
}

void PrefixCache::release(PageTable& table) {
  table.release_owned(allocator_);
  const std::vector<int32_t> shared = table.take_shared();
  for (auto it = shared.rbegin(); it != shared.rend(); ++it) unref(*it);
}

int32_t PrefixCache::tail_page(int64_t n_written, const PageTable& table) {
  const int64_t j = table.shared_pages();
  const int64_t t = n_written - j * kPageSize;
  if (t <= 0 || t >= kPageSize || j >= int64_t(table.pages().size())) return 0;
  return table.pages()[size_t(j)];
}

int32_t PrefixCache::keep_tail(std::span<const int32_t> tokens, int64_t prompt_len,
                               int64_t n_written, PageTable& table, std::vector<int32_t>& freed) {
  const int64_t j = table.shared_pages();
  if (!tail_page(n_written, table) || int64_t(tokens.size()) < n_written) return 0;
  const int32_t parent = j > 0 ? table.pages()[size_t(j - 1)] : 0;
  uint64_t parent_serial = 0;
  if (parent) {
    const Node& p = nodes_.at(parent);
    if (p.poisoned) return 0;
    parent_serial = p.serial;
  }
  std::vector<int32_t>& siblings = tail_index_[parent_serial];
  if (siblings.size() >= kTailsPerParent) evict_tail(siblings.front(), freed);

  const int32_t page = table.take_first_owned();
  allocator_.to_cached(page);  // throws unless the table owned it
  Tail& tail = tails_[page];
  tail.parent = parent;
  tail.parent_serial = parent_serial;
  tail.tokens.assign(tokens.begin() + j * kPageSize, tokens.begin() + n_written);
  tail.prompt_tokens =
      std::clamp<int64_t>(prompt_len - j * kPageSize, 0, int64_t(tail.tokens.size()));
  tail.lru = lru_.insert(lru_.end(), page);
  tail_index_[parent_serial].push_back(page);  // `siblings` may be gone with evict_tail
  if (parent) nodes_.at(parent).tails.push_back(page);
  return page;
}

PrefixCache::TailMatch PrefixCache::match_tail(std::span<const int32_t> tokens,
                                               std::span<const int32_t> pages,
                                               int64_t max_tokens) const {
  const uint64_t parent_serial = pages.empty() ? 0 : nodes_.at(pages.back()).serial;
  const int64_t base = int64_t(pages.size()) * kPageSize;
  const int64_t limit =
      std::min({max_tokens, int64_t(tokens.size()) - base, int64_t(kPageSize) - 1});
  TailMatch best;
  auto it = tail_index_.find(parent_serial);
  if (limit <= 0 || it == tail_index_.end()) return best;
  const std::span<const int32_t> want = tokens.subspan(size_t(base), size_t(limit));
  for (int32_t page : it->second) {
    const Tail& tail = tails_.at(page);
    const size_t n = std::min(tail.tokens.size(), want.size());
    const auto diff =
        std::mismatch(tail.tokens.begin(), tail.tokens.begin() + ptrdiff_t(n), want.begin());
    const int64_t same = diff.first - tail.tokens.begin();
    if (same >= std::max<int64_t>(tail.prompt_tokens, 1) && same > best.tokens) {
      best = {page, same};
    }
  }
  return best;
}

void PrefixCache::take_tail(int32_t page, PageTable& table) {
  auto it = tails_.find(page);
  require(it != tails_.end() && !it->second.poisoned, ErrorCode::kInvalidArgument,
          "prefix cache: page {} is not a live tail", page);
  require(table.shared_pages() == int64_t(table.pages().size()), ErrorCode::kInvalidArgument,
          "prefix cache: a tail goes only after a table's shared pages, this one owns {}",
          int64_t(table.pages().size()) - table.shared_pages());
  const int32_t last = table.empty() ? 0 : table.pages().back();
  require(last == it->second.parent, ErrorCode::kInvalidArgument,
          "prefix cache: tail page {} continues page {}, the table ends with page {}", page,
          it->second.parent, last);
  unindex_tail(page);
  if (it->second.parent) std::erase(nodes_.at(it->second.parent).tails, page);
  lru_.erase(it->second.lru);
  tails_.erase(it);
  allocator_.to_owned(page);
  table.append_owned(page);
}

void PrefixCache::unindex_tail(int32_t page) {
  const Tail& tail = tails_.at(page);
  auto it = tail_index_.find(tail.parent_serial);
  if (it == tail_index_.end()) return;
  std::erase(it->second, page);
  if (it->second.empty()) tail_index_.erase(it);
}

void PrefixCache::evict_tail(int32_t page, std::vector<int32_t>& freed) {
  unindex_tail(page);
  const Tail& tail = tails_.at(page);
  if (tail.parent) std::erase(nodes_.at(tail.parent).tails, page);
  lru_.erase(tail.lru);
  tails_.erase(page);
  allocator_.release_cached(page);
  freed.push_back(page);
}

void PrefixCache::evict_subtree(int32_t page, std::vector<int32_t>& freed) {
  Node& n = nodes_.at(page);
  require(n.refs == 0, ErrorCode::kInternal,
          "prefix cache: evicting page {} with {} references (a child outlived its parent's "
          "references)",
          page, n.refs);
  while (!n.children.empty()) evict_subtree(n.children.back(), freed);
  while (!n.tails.empty()) evict_tail(n.tails.back(), freed);
  lru_.erase(n.lru);
  if (n.indexed) index_.erase(n.key);
  if (n.parent) std::erase(nodes_.at(n.parent).children, page);
  nodes_.erase(page);
  allocator_.release_cached(page);
  freed.push_back(page);
}

int64_t PrefixCache::evict(int64_t n, std::vector<int32_t>& freed) {
  const size_t before = freed.size();
  while (int64_t(freed.size() - before) < n && !lru_.empty()) {
    if (tails_.count(lru_.front())) {
      evict_tail(lru_.front(), freed);
    } else {
      evict_subtree(lru_.front(), freed);
    }
  }
  return int64_t(freed.size() - before);
}

void PrefixCache::poison(int32_t page) {
  if (auto t = tails_.find(page); t != tails_.end()) {
    if (t->second.poisoned) return;
    unindex_tail(page);
    t->second.poisoned = true;
    lru_.splice(lru_.begin(), lru_, t->second.lru);
    return;
  }
  auto it = nodes_.find(page);
  if (it == nodes_.end() || it->second.poisoned) return;
  Node& n = it->second;
  n.poisoned = true;
  if (n.indexed) index_.erase(n.key);  // never matched again; nor are its descendants
  n.indexed = false;
  if (n.refs == 0) lru_.splice(lru_.begin(), lru_, n.lru);
}

int32_t PrefixCache::refcount(int32_t page) const {  // 0 for a tail too: never shared
  auto it = nodes_.find(page);
  return it == nodes_.end() ? 0 : it->second.refs;
}

void PrefixCache::check_invariants() const {
  auto broken = [](bool ok, std::string what) {
    require(ok, ErrorCode::kInternal, "prefix cache invariant broken: {}", what);
  };
  broken(int64_t(nodes_.size() + tails_.size()) == allocator_.cached_pages(),
         fmt::format("{} nodes and {} tails but the allocator holds {} pages as cached",
                     nodes_.size(), tails_.size(), allocator_.cached_pages()));
  size_t unreferenced = 0;
  int64_t references = 0;
  for (const auto& [page, n] : nodes_) {
    references += n.refs;
    broken(n.page == page && allocator_.state(page) == PageState::kCached,
           fmt::format("page {} is in the cache but {} in the allocator", page,
                       page_state_name(allocator_.state(page))));
    broken(n.refs >= 0, fmt::format("page {} has {} references", page, n.refs));
    unreferenced += n.refs == 0;
    if (n.parent) {
      const Node& p = nodes_.at(n.parent);
      broken(p.serial == n.parent_serial, fmt::format("page {}'s parent was replaced", page));
      broken(p.refs >= n.refs, fmt::format("page {} has {} references, its parent {} only {}", page,
                                           n.refs, n.parent, p.refs));
      broken(std::count(p.children.begin(), p.children.end(), page) == 1,
             fmt::format("page {} is not listed once among its parent's children", page));
    }
    if (n.indexed) {
      auto it = index_.find(n.key);
      broken(it != index_.end() && it->second == page,
             fmt::format("page {} is not found under its key", page));
    }
  }
  broken(references == references_,
         fmt::format("{} references counted, {} recorded", references, references_));
  size_t indexed_tails = 0;
  for (const auto& [page, tail] : tails_) {
    broken(allocator_.state(page) == PageState::kCached && !nodes_.count(page),
           fmt::format("tail page {} is {} in the allocator", page,
                       page_state_name(allocator_.state(page))));
    broken(!tail.tokens.empty() && tail.tokens.size() < size_t(kPageSize),
           fmt::format("tail page {} holds {} tokens", page, tail.tokens.size()));
    broken(!tail.parent ||
               (nodes_.count(tail.parent) && nodes_.at(tail.parent).serial == tail.parent_serial &&
                std::count(nodes_.at(tail.parent).tails.begin(), nodes_.at(tail.parent).tails.end(),
                           page) == 1),
           fmt::format("tail page {} is not listed once under its parent {}", page, tail.parent));
    indexed_tails += !tail.poisoned;
  }
  size_t listed_tails = 0;
  for (const auto& [serial, pages] : tail_index_) {
    broken(!pages.empty(), "an empty tail list in the index");
    for (int32_t page : pages) {
      broken(tails_.count(page) && !tails_.at(page).poisoned &&
                 tails_.at(page).parent_serial == serial,
             fmt::format("the tail index names page {}, not a live tail under it", page));
    }
    listed_tails += pages.size();
  }
  broken(listed_tails == indexed_tails,
         fmt::format("{} live tails, {} in the index", indexed_tails, listed_tails));
  unreferenced += tails_.size();
  broken(unreferenced == lru_.size(),
         fmt::format("{} unreferenced pages but {} on the LRU list", unreferenced, lru_.size()));
  for (int32_t page : lru_) {
    broken(tails_.count(page) || nodes_.at(page).refs == 0, "a referenced page on the LRU list");
  }
  for (const auto& [key, page] : index_) {
    broken(nodes_.count(page) && nodes_.at(page).indexed, "the index names a dead node");
  }
}

}  // namespace dsa
