#include "text/byte_level.h"

#include "text/utf8.h"

namespace dsa::text {
namespace {

constexpr bool stands_for_itself(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

constexpr std::array<char32_t, 256> make_alphabet() {
  std::array<char32_t, 256> a{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) a[b] = stands_for_itself(b) ? char32_t(b) : next++;
  return a;
}

constexpr std::array<char32_t, 256> kAlphabet = make_alphabet();

// Code point -> byte for the 324 code points below U+0144 the alphabet uses; -1 elsewhere.
constexpr std::array<int16_t, 0x144> make_inverse() {
  std::array<int16_t, 0x144> inv{};
  for (auto& v : inv) v = -1;
  for (int b = 0; b < 256; ++b) inv[kAlphabet[b]] = int16_t(b);
  return inv;
}

constexpr std::array<int16_t, 0x144> kInverse = make_inverse();

}  // namespace

const std::array<char32_t, 256>& byte_level_alphabet() { return kAlphabet; }

std::optional<std::string> byte_level_to_bytes(std::string_view spelling) {
  std::string out;
  size_t pos = 0;
  while (pos < spelling.size()) {
    const Utf8Step step = utf8_step(spelling, pos);
    if (step.kind != Utf8Step::kValid) return std::nullopt;
    char32_t cp;
    const auto* p = reinterpret_cast<const uint8_t*>(spelling.data() + pos);
    if (step.length == 1) {
      cp = p[0];
    } else if (step.length == 2) {
      cp = char32_t(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    } else {
      return std::nullopt;  // every alphabet code point is below U+0800
    }
    if (cp >= kInverse.size() || kInverse[cp] < 0) return std::nullopt;
    out += char(kInverse[cp]);
    pos += step.length;
  }
  return out;
}

}  // namespace dsa::text
