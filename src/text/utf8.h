// UTF-8 scanning for the text layer: validation with byte offsets, and the step-by-step decoder
// the stream decoder uses (valid character, invalid maximal subpart, or an incomplete tail).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dsa::text {

struct Utf8Step {
  enum Kind { kValid, kInvalid, kIncomplete } kind;
  size_t length;  // bytes of the character, of the maximal invalid subpart, or of the tail
};

// The next step of `s` at `pos` (< s.size()). kIncomplete only when the bytes up to the end of
// `s` are a proper prefix of a valid character.
Utf8Step utf8_step(std::string_view s, size_t pos);

// Throws kInvalidArgument naming `what`, the byte offset and the byte when `s` is not valid UTF-8.
void require_utf8(std::string_view s, std::string_view what);

// Appends the UTF-8 encoding of a code point (< 0x110000, not a surrogate).
void append_utf8(std::string& out, char32_t cp);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace dsa::text
