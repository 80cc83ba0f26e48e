// The text of one request's tokens, as it streams: never half a UTF-8 character, stop strings
// matched on the decoded text (across token boundaries), and a tail held back while it could still
// be the start of a stop string. The sentence tokens (BOS, EOS) are not text and are skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsa/text/tokenizer.h"

namespace dsa::server {

class TextStream {
 public:
  TextStream(const text::Tokenizer& tokenizer, std::vector<std::string> stop);

  // Adds one token; returns the text that became final (possibly empty). Once a stop string
  // matched, stopped() is true, the text before it has been returned, and the rest is dropped.
  std::string push(int32_t token);
  // The held-back tail, once no token will follow (empty after a stop).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::string release();  // returns pending_ except a tail that may begin a stop string

  text::StreamDecoder decoder_;
  std::vector<std::string> stop_;
  int32_t bos_ = -1, eos_ = -1;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace dsa::server
