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

void PrefixCache::evict_subtree(int32_t page, std::vector<int32_t>& freed) {
  Node& n = nodes_.at(page);
  require(n.refs == 0, ErrorCode::kInternal,
          "prefix cache: evicting page {} with {} references (a child outlived its parent's "
          "references)",
          page, n.refs);
  while (!n.children.empty()) evict_subtree(n.children.back(), freed);
  lru_.erase(n.lru);
  if (n.indexed) index_.erase(n.key);
  if (n.parent) std::erase(nodes_.at(n.parent).children, page);
  nodes_.erase(page);
  allocator_.release_cached(page);
  freed.push_back(page);
}

int64_t PrefixCache::evict(int64_t n, std::vector<int32_t>& freed) {
  const size_t before = freed.size();
  while (int64_t(freed.size() - before) < n && !lru_.empty()) evict_subtree(lru_.front(), freed);
  return int64_t(freed.size() - before);
}

void PrefixCache::poison(int32_t page) {
  auto it = nodes_.find(page);
  if (it == nodes_.end() || it->second.poisoned) return;
  Node& n = it->second;
  n.poisoned = true;
  if (n.indexed) index_.erase(n.key);  // never matched again; nor are its descendants
  n.indexed = false;
  if (n.refs == 0) lru_.splice(lru_.begin(), lru_, n.lru);
}

int32_t PrefixCache::refcount(int32_t page) const {
  auto it = nodes_.find(page);
  return it == nodes_.end() ? 0 : it->second.refs;
}

void PrefixCache::check_invariants() const {
  auto broken = [](bool ok, std::string what) {
    require(ok, ErrorCode::kInternal, "prefix cache invariant broken: {}", what);
  };
  broken(int64_t(nodes_.size()) == allocator_.cached_pages(),
         fmt::format("{} nodes but the allocator holds {} pages as cached", nodes_.size(),
                     allocator_.cached_pages()));
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
  broken(unreferenced == lru_.size(),
         fmt::format("{} unreferenced pages but {} on the LRU list", unreferenced, lru_.size()));
  for (int32_t page : lru_) broken(nodes_.at(page).refs == 0, "a referenced page on the LRU list");
  for (const auto& [key, page] : index_) {
    broken(nodes_.count(page) && nodes_.at(page).indexed, "the index names a dead node");
  }
}

}  // namespace dsa
