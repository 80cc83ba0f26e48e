// The BPE merge step of a byte-level tokenizer, on raw bytes: a word (one pre-tokenized piece)
// starts as one symbol per byte and repeatedly merges the adjacent pair of lowest merge rank,
// leftmost first, until no adjacent pair has a merge. Ranks live in an open-addressing hash map
// keyed by the pair of ids; long words merge through a heap (O(n log n)); words up to 256 bytes
// are cached.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsa::text {

struct Merge {
  int32_t left, right, result;  // ids; rank = position in the list
};

class Bpe {
 public:
  // byte_ids[b]: the id of the one-byte token b. merges in rank order; a repeated pair keeps its
  // last rank (as Hugging Face's map does). With ignore_merges, a word that is itself a
  // vocabulary entry (`whole_words`: bytes -> id) is that entry.
  Bpe(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
      std::unordered_map<std::string, int32_t> whole_words, bool ignore_merges);
  Bpe(Bpe&&) = delete;

  // Appends the ids of one word (non-empty bytes).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // The merge of (left, right): rank and result, or rank -1 when the pair does not merge.
  struct RankedMerge {
    int32_t rank, result;
  };
  RankedMerge find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return {s.rank, s.result};
      if (s.key == kEmpty) return {-1, -1};
    }
  }

 private:
  static uint64_t pair_key(int32_t a, int32_t b) {
    return uint64_t(uint32_t(a)) << 32 | uint32_t(b);
  }
  static size_t hash(uint64_t k) { return size_t((k * 0x9E3779B97F4A7C15ull) >> 20); }
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = -1, result = -1;
  };
  void merge_short(std::string_view word, std::vector<int32_t>& out) const;
  void merge_long(std::string_view word, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_ids_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::unordered_map<std::string, int32_t> whole_words_;
  bool ignore_merges_;

  // The word cache: shared by every thread encoding with this tokenizer.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  static constexpr size_t kCacheMaxWords = 1 << 17;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace dsa::text
