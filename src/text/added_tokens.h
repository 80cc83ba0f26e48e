// Matching added tokens ("<｜User｜>", "<｜end▁of▁sentence｜>", ...) in text: a byte trie scanned
// left to right that takes the longest token starting at the leftmost position where one starts
// (Hugging Face's leftmost-longest rule).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace dsa::text {

class TokenTrie {
 public:
  void add(std::string_view content, int32_t id);
  bool empty() const { return nodes_.size() <= 1; }

  struct Match {
    size_t begin, length;
    int32_t id;
  };
  // The leftmost-longest match in text[from, end), or length 0 when none.
  Match find(std::string_view text, size_t from) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node), sorted by byte
    int32_t id = -1;                                    // the token ending here
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> starts_{};  // bytes that begin some token
};

}  // namespace dsa::text
