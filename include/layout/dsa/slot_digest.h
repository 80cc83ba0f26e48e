// The digest of one slot's bytes in one pool (DESIGN §6). One definition for both backends, so
// a digest recorded on one is comparable on the other. Includable from CUDA code.
#pragma once

#include <cstdint>

#include "dsa/token_codec.h"

namespace dsa {

// 64-bit multiply-xorshift over little-endian 4-byte words (every layout's token is a whole number
// of words: 256, 132, 1152 and 656 bytes). Not cryptographic: it catches accidental overwrites.
DSA_HD uint64_t digest_words(uint64_t h, const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i + 4 <= bytes; i += 4) {
    const uint32_t w = uint32_t(p[i]) | uint32_t(p[i + 1]) << 8 | uint32_t(p[i + 2]) << 16 |
                       uint32_t(p[i + 3]) << 24;
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  return h;
}

DSA_HD uint64_t slot_digest(const SlotBytes& b) {
  uint64_t h = 0xCBF29CE484222325ull;
  h = digest_words(h, b.first, b.first_len);
  if (b.second) h = digest_words(h, b.second, b.second_len);
  return h ^ (h >> 31);
}

}  // namespace dsa
