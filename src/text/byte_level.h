// The byte-level alphabet of GPT-2-style BPE: each of the 256 bytes is spelled as one printable
// code point. Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for themselves; the other 68 bytes
// take U+0100, U+0101, ... in increasing byte order (so the space 0x20 is U+0120 'Ġ').
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsa::text {

// The code point that spells each byte.
const std::array<char32_t, 256>& byte_level_alphabet();

// The bytes a byte-level spelling stands for; nullopt when it holds a code point outside the
// alphabet (or is not valid UTF-8).
std::optional<std::string> byte_level_to_bytes(std::string_view spelling);

}  // namespace dsa::text
