#include "text/added_tokens.h"

#include <algorithm>

namespace dsa::text {

int32_t TokenTrie::child(int32_t node, uint8_t byte) const {
  const auto& c = nodes_[node].children;
  auto it = std::lower_bound(c.begin(), c.end(), std::pair<uint8_t, int32_t>(byte, INT32_MIN));
  return it != c.end() && it->first == byte ? it->second : -1;
}

void TokenTrie::add(std::string_view content, int32_t id) {
  if (content.empty()) return;
  starts_[uint8_t(content[0])] = true;
  int32_t node = 0;
  for (const char ch : content) {
    const auto byte = uint8_t(ch);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = int32_t(nodes_.size());
      nodes_.push_back(Node{});
      auto& c = nodes_[node].children;
      c.insert(std::lower_bound(c.begin(), c.end(), std::pair<uint8_t, int32_t>(byte, INT32_MIN)),
               {byte, next});
    }
    node = next;
  }
  nodes_[node].id = id;
}

TokenTrie::Match TokenTrie::find(std::string_view text, size_t from) const {
  for (size_t begin = from; begin < text.size(); ++begin) {
    if (!starts_[uint8_t(text[begin])]) continue;
    Match best{begin, 0, -1};
    int32_t node = 0;
    for (size_t i = begin; i < text.size(); ++i) {
      node = child(node, uint8_t(text[i]));
      if (node < 0) break;
      if (nodes_[node].id >= 0) best = {begin, i + 1 - begin, nodes_[node].id};
    }
    if (best.length > 0) return best;
  }
  return {text.size(), 0, -1};
}

}  // namespace dsa::text
