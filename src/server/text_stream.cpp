#include "server/text_stream.h"

#include <algorithm>

namespace dsa::server {

TextStream::TextStream(const text::Tokenizer& tokenizer, std::vector<std::string> stop)
    : decoder_(tokenizer), stop_(std::move(stop)) {
  bos_ = tokenizer.bos_id().value_or(-1);
  eos_ = tokenizer.eos_id().value_or(-1);
}

std::string TextStream::push(int32_t token) {
  if (stopped_ || token == bos_ || token == eos_) return {};
  pending_ += decoder_.push(token);
  return release();
}

std::string TextStream::finish() {
  if (stopped_) return {};
  pending_ += decoder_.finish();
  std::string out = release();
  if (!stopped_) {
    out += pending_;
    pending_.clear();
  }
  return out;
}

std::string TextStream::release() {
  // The earliest stop string wins.
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

}  // namespace dsa::server
