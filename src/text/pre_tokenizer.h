// The pre-tokenizer of byte-level BPE tokenizer.json files: Split steps (PCRE2 regexes taken from
// the file) applied in order, each to every piece the previous step produced, then ByteLevel
// (which only respells bytes, so here it is the identity on raw bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::text {

struct Piece {
  uint32_t begin, length;  // a byte range of the text
};

class PreTokenizer {
 public:
  // `pre` is the file's "pre_tokenizer" value; `source` names the file in errors.
  static PreTokenizer from_json(const nlohmann::json& pre, std::string_view source);
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // PCRE2 match state for one thread; make one per encode call and reuse it across split()s.
  class Scratch;
  struct ScratchDeleter {
    void operator()(Scratch* s) const;
  };
  static std::unique_ptr<Scratch, ScratchDeleter> make_scratch();

  // Appends the pieces of `text` (valid UTF-8) to `out`, in order, covering it without gaps;
  // `base` is added to their offsets.
  void split(std::string_view text, uint32_t base, std::vector<Piece>& out, Scratch& scratch) const;

  struct Regex;  // a compiled Split pattern

 private:
  std::vector<std::unique_ptr<Regex>> splits_;
};

}  // namespace dsa::text
