// The prefix cache (DESIGN §8): full 64-token pages shared across requests and turns by reference
// count, keyed by the token ids of the whole prefix they end.
//
// Shape. A hash chain of full pages: the node of page j of a prefix is found under
// hash(tokens[64j, 64j + 64), serial of the node of page j - 1), and holds its 64 token ids and its
// parent's serial, which are compared on every match, so a hash collision is a miss and never
// another prefix's pages. Serials are never reused: a page id that is evicted and handed out again
// can never be mistaken for its previous node. Lookup and insert cost O(prefix / 64) hash-map
// probes (each hashing 64 tokens).
//
// Safety. A page in the cache is read-only: the allocator holds it as PageState::kCached, and no
// store may target it (first_unwritable_slot, checked before every engine step). A request's page
// table is a prefix of shared pages (PageTable::shared_pages()) followed by pages it owns alone;
// only the owned ones are ever written. A page joins the cache only when all 64 of its tokens are
// written, so a partly filled page is never shared.
//
// Tails. The last, partly filled page of a finished request (its tail: t < 64 tokens written
// after a chain of cached full pages) is kept too, but never shared: it is keyed under its
// parent's serial with its t token ids and how many of them were the finished request's prompt.
// A later request under the same chain that agrees with the tail's first j tokens, j covering at
// least that prompt part, TAKES it: the page leaves the cache and becomes the request's own, its
// first owned page, and the request prefills from row j on. Rows below j are exactly what it
// would have computed (the kernels are batch-invariant); rows j..t-1, the rest of the previous
// reply, are rewritten by the taker's own prefill before anything reads them (a row is read only
// at positions at or below the one being computed, and is stored first). This is the next turn
// of a conversation: it resends its whole history, so it agrees with the last turn's prompt and
// usually with its reply only in part (a reply re-encoded from text need not give back the
// generated ids). Requiring the prompt part keeps another conversation that shares only a system
// prompt from taking the page: a tail has one taker.
//
// Eviction. Pages no table references sit on a least-recently-used list; a table releases its
// shared pages deepest first, so a parent is always more recent than its children and the list's
// head is a leaf. Evicting a node that still has children (possible only for a poisoned one) takes
// its whole subtree, which no table references either: a table always holds a root chain, so a
// child's reference count never exceeds its parent's.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "dsa/cache.h"

namespace dsa {

// The owner id the auditor records for slots of pages held by the prefix cache.
inline constexpr int64_t kPrefixCacheOwner = -2;

// The host-side store check: the index of the first slot that lies in a page not owned by exactly
// one request (cached, free, or out of range), or -1 when every slot may be written. kPadSlot
// entries are skipped (the store guard skips them).
int64_t first_unwritable_slot(const PageAllocator& allocator, std::span<const int64_t> slots);

class PrefixCache {
 public:
  explicit PrefixCache(PageAllocator& allocator);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The cached pages holding the longest prefix of `tokens` in whole pages, at most max_pages of
  // them, in order. Changes nothing (no reference is taken, recency is not touched).
  std::vector<int32_t> match(std::span<const int32_t> tokens, int64_t max_pages) const;
  // References pages (a match's first pages) as the empty table's shared prefix.
  void share(std::span<const int32_t> pages, PageTable& table);

  enum class Insert : uint8_t {
    kInserted,  // the table's owned page became a cached page
    kSwapped,   // an identical cached page existed: the table now shares it, its own page is free
    kRefused,   // the parent is poisoned (or a hash collision): the page stays owned
  };
  struct InsertResult {
    Insert outcome = Insert::kRefused;
    int32_t page = 0;   // the cached page the table now shares (kInserted, kSwapped)
    int32_t freed = 0;  // kSwapped: the table's own page, now free
  };
  // Page table.shared_pages() of the table holds tokens[0, 64 * (that + 1)) fully written: makes it
  // shared. `tokens` is the table's whole token sequence so far (at least that many tokens).
  InsertResult insert_next(std::span<const int32_t> tokens, PageTable& table);

  // Releases every page of the table: shared pages lose a reference (deepest first, so a parent
  // stays more recent than its children), owned pages go back to the allocator.
  void release(PageTable& table);

  // Before release: keeps the table's tail, its page shared_pages() holding tokens
  // [64 * shared_pages(), n_written) of `tokens`, when that range is not empty and shorter than a
  // page and the last shared page is live (not poisoned). The page leaves the table as a cached,
  // unreferenced tail (evictable, least recent before its parents). At most kTailsPerParent tails
  // are kept under one parent: the oldest goes (its page id appended to `freed`). Returns the page
  // kept, or 0.
  static constexpr size_t kTailsPerParent = 8;
  // The page keep_tail would keep (the table's page shared_pages() when it holds 1..63 of the
  // n_written tokens), or 0. Changes nothing.
  static int32_t tail_page(int64_t n_written, const PageTable& table);
  // tokens[0, prompt_len) was the request's prompt.
  int32_t keep_tail(std::span<const int32_t> tokens, int64_t prompt_len, int64_t n_written,
                    PageTable& table, std::vector<int32_t>& freed);
  struct TailMatch {
    int32_t page = 0;    // 0: none
    int64_t tokens = 0;  // the tail's first `tokens` ids equal the request's
  };
  // The tail under the chain `pages` (a match's result, shared by the table) that agrees longest
  // with tokens[64 * pages.size(), ...), at most max_tokens of them, among those whose agreement
  // covers their prompt part (and at least one token). Changes nothing.
  TailMatch match_tail(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                       int64_t max_tokens) const;
  // Hands a tail to the table, whose pages are all shared (a match's chain): the page becomes the
  // table's first owned page and leaves the cache.
  void take_tail(int32_t page, PageTable& table);
  int64_t tails() const { return int64_t(tails_.size()); }

  // Frees at least n unreferenced cached pages, least recently used first, or all there are;
  // appends the freed page ids to `freed` and returns how many.
  int64_t evict(int64_t n, std::vector<int32_t>& freed);
  // A page whose contents changed behind the cache's back: it is never matched again, and it is
  // evicted first once no table references it.
  void poison(int32_t page);

  int32_t refcount(int32_t page) const;  // 0 for a page not in the cache
  bool contains(int32_t page) const { return nodes_.count(page) != 0 || tails_.count(page) != 0; }
  int64_t cached_pages() const { return int64_t(nodes_.size() + tails_.size()); }
  int64_t evictable_pages() const { return int64_t(lru_.size()); }
  int64_t references() const { return references_; }  // summed over every cached page
  // Checks the cache's own invariants (every node's page is kCached in the allocator, the LRU list
  // holds exactly the unreferenced nodes, children counts match, the index points at live nodes);
  // throws kInternal naming the first one broken. O(cached pages): for tests and diagnostics.
  void check_invariants() const;

 private:
  struct Node {
    int32_t page = 0;
    uint64_t serial = 0;
    uint64_t key = 0;             // the index key (hash of tokens and the parent's serial)
    int32_t parent = 0;           // the parent's page, 0 for a prefix's first page
    uint64_t parent_serial = 0;   // 0 for a prefix's first page
    std::vector<int32_t> tokens;  // [64]
    std::vector<int32_t> children;
    std::vector<int32_t> tails;  // every tail kept under this page, poisoned or not
    int32_t refs = 0;
    bool poisoned = false;
    bool indexed = false;
    std::list<int32_t>::iterator lru;  // valid while refs == 0
  };
  struct Tail {
    int32_t parent = 0;  // the parent's page, 0 for a prefix's first page
    uint64_t parent_serial = 0;
    std::vector<int32_t> tokens;  // [1, 64)
    int64_t prompt_tokens = 0;    // tokens[0, prompt_tokens) were the writer's prompt
    bool poisoned = false;
    std::list<int32_t>::iterator lru;  // always valid: a tail is never referenced
  };
  const Node* find_child(uint64_t parent_serial, std::span<const int32_t> page_tokens) const;
  void unref(int32_t page);
  void evict_subtree(int32_t page, std::vector<int32_t>& freed);
  void unindex_tail(int32_t page);                             // never matched again
  void evict_tail(int32_t page, std::vector<int32_t>& freed);  // back to the allocator

  PageAllocator& allocator_;
  uint64_t next_serial_ = 1;
  int64_t references_ = 0;
  std::unordered_map<int32_t, Node> nodes_;      // cached page -> its node
  std::unordered_map<uint64_t, int32_t> index_;  // key -> page
  std::unordered_map<int32_t, Tail> tails_;      // tail page -> its tail
  // parent serial -> its live (unpoisoned) tails' pages, oldest first
  std::unordered_map<uint64_t, std::vector<int32_t>> tail_index_;
  std::list<int32_t> lru_;  // unreferenced pages, least recent first
};

}  // namespace dsa
