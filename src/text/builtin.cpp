// The project's own tokenizers, compiled in from data/tokenizers/ (see src/text/CMakeLists.txt).
#include "dsa/text/tokenizer.h"

namespace dsa::text {

// Generated: builtin_tokenizer_data.cpp in the build directory.
extern const char kTinyTokenizerJson[];
extern const size_t kTinyTokenizerJsonSize;
extern const char kTinyTokenizerConfigJson[];
extern const size_t kTinyTokenizerConfigJsonSize;

std::optional<TokenizerFiles> builtin_tokenizer(std::string_view name) {
  if (name == "tiny")
    return TokenizerFiles{{kTinyTokenizerJson, kTinyTokenizerJsonSize},
                          {kTinyTokenizerConfigJson, kTinyTokenizerConfigJsonSize}};
  return std::nullopt;
}

}  // namespace dsa::text
