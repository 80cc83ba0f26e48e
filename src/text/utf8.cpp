#include "text/utf8.h"

#include "dsa/error.h"

namespace dsa::text {

Utf8Step utf8_step(std::string_view s, size_t pos) {
  const auto b0 = uint8_t(s[pos]);
  if (b0 < 0x80) return {Utf8Step::kValid, 1};
  // The length of the sequence and the allowed range of its second byte (Unicode table 3-7).
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return {Utf8Step::kInvalid, 1};
  }
  size_t i = 1;
  for (; i < need; ++i) {
    if (pos + i >= s.size()) return {Utf8Step::kIncomplete, i};
    const auto b = uint8_t(s[pos + i]);
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {Utf8Step::kInvalid, i};
  }
  return {Utf8Step::kValid, need};
}

void require_utf8(std::string_view s, std::string_view what) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path: 8 bytes at a time.
    while (pos + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + pos, 8);
      if (w & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= s.size()) break;
    const Utf8Step step = utf8_step(s, pos);
    require(step.kind == Utf8Step::kValid, ErrorCode::kInvalidArgument,
            "{} is not valid UTF-8: byte 0x{:02X} at offset {} {}", what, uint8_t(s[pos]), pos,
            step.kind == Utf8Step::kIncomplete ? "starts a character cut off by the end"
                                               : "does not start a valid character");
    pos += step.length;
  }
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace dsa::text
