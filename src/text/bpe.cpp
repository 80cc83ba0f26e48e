#include "text/bpe.h"

#include <algorithm>
#include <bit>
#include <mutex>
#include <queue>

namespace dsa::text {

Bpe::Bpe(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
         std::unordered_map<std::string, int32_t> whole_words, bool ignore_merges)
    : byte_ids_(byte_ids), whole_words_(std::move(whole_words)), ignore_merges_(ignore_merges) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, merges.size() * 2));
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    const uint64_t key = pair_key(m.left, m.right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty || s.key == key) {
        s = {key, int32_t(rank), m.result};
        break;
      }
    }
  }
}

// Words of up to kShort bytes: the ranks of adjacent pairs kept in an array, the lowest found by
// a scan (no allocation, O(n) hash lookups, O(n^2) comparisons on at most 64 symbols).
void Bpe::merge_short(std::string_view word, std::vector<int32_t>& out) const {
  constexpr size_t kShort = 64;
  int32_t ids[kShort];
  RankedMerge pair[kShort];  // pair[i]: the merge of ids[i] and ids[i + 1]
  size_t n = word.size();
  for (size_t i = 0; i < n; ++i) ids[i] = byte_ids_[uint8_t(word[i])];
  for (size_t i = 0; i + 1 < n; ++i) pair[i] = find(ids[i], ids[i + 1]);
  while (n > 1) {
    size_t best = n;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (pair[i].rank >= 0 && pair[i].rank < best_rank) {
        best_rank = pair[i].rank;
        best = i;
      }
    }
    if (best == n) break;
    ids[best] = pair[best].result;
    for (size_t i = best + 1; i + 1 < n; ++i) ids[i] = ids[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) pair[i] = pair[i + 1];
    --n;
    if (best > 0) pair[best - 1] = find(ids[best - 1], ids[best]);
    if (best + 1 < n) pair[best] = find(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids, ids + n);
}

// Longer words: symbols in a linked list, candidate merges in a min-heap of (rank, position);
// a popped candidate is used only if its pair still stands (O(n log n)).
void Bpe::merge_long(std::string_view word, std::vector<int32_t>& out) const {
  const int32_t n = int32_t(word.size());
  std::vector<int32_t> ids(n), prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    ids[i] = byte_ids_[uint8_t(word[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  using Candidate = std::pair<int32_t, int32_t>;  // (rank, left position)
  std::vector<Candidate> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap(
      std::greater<>(), std::move(heap_storage));
  for (int32_t i = 0; i + 1 < n; ++i) {
    const RankedMerge m = find(ids[i], ids[i + 1]);
    if (m.rank >= 0) heap.push({m.rank, i});
  }
  while (!heap.empty()) {
    const auto [rank, left] = heap.top();
    heap.pop();
    const int32_t right = next[left];
    if (ids[left] < 0 || right < 0) continue;  // merged away, or now last
    const RankedMerge m = find(ids[left], ids[right]);
    if (m.rank != rank) continue;  // the pair changed since this candidate was pushed
    ids[left] = m.result;
    ids[right] = -1;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    if (prev[left] >= 0) {
      const RankedMerge p = find(ids[prev[left]], ids[left]);
      if (p.rank >= 0) heap.push({p.rank, prev[left]});
    }
    if (next[left] >= 0) {
      const RankedMerge p = find(ids[left], ids[next[left]]);
      if (p.rank >= 0) heap.push({p.rank, left});
    }
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[uint8_t(word[0])]);
    return;
  }
  if (ignore_merges_) {
    if (auto it = whole_words_.find(std::string(word)); it != whole_words_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  if (word.size() <= 64) {
    merge_short(word, out);
  } else {
    merge_long(word, out);
  }
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheMaxWords)
      cache_.try_emplace(std::string(word), out.begin() + first, out.end());
  }
}

}  // namespace dsa::text
