// The digest of one slot's bytes in one pool (DESIGN §6). One definition for both backends, so
// a digest recorded on one is comparable on the other. Includable from CUDA code.
#pragma once

#include <cstdint>

#include "dsa/token_codec.h"

namespace dsa {

// 64-bit multiply-xorshift over little-endian 4-byte words (every layout's token is a whole number
// of words: 256, 132, 1152 and 656 bytes). Not cryptographic: it catches accidental overwrites.
// digest_word is one step; a kernel may read the words however it likes (e.g. 16 bytes at a time)
// as long as it feeds them in order from kDigestSeed and ends with digest_final.
inline constexpr uint64_t kDigestSeed = 0xCBF29CE484222325ull;

DSA_HD uint64_t digest_word(uint64_t h, uint32_t w) {
  h = (h ^ w) * 0x100000001B3ull;
  return h ^ (h >> 29);
}

DSA_HD uint64_t digest_final(uint64_t h) { return h ^ (h >> 31); }

DSA_HD uint64_t digest_words(uint64_t h, const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i + 4 <= bytes; i += 4) {
    h = digest_word(h, uint32_t(p[i]) | uint32_t(p[i + 1]) << 8 | uint32_t(p[i + 2]) << 16 |
                           uint32_t(p[i + 3]) << 24);
  }
  return h;
}

DSA_HD uint64_t slot_digest(const SlotBytes& b) {
  uint64_t h = kDigestSeed;
  h = digest_words(h, b.first, b.first_len);
  if (b.second) h = digest_words(h, b.second, b.second_len);
  return digest_final(h);
}

// The auditor's sampling rule, one definition for the host's verify and the device's: `count`
// draws from the watched positions [0, n), one in each of `count` strata (widths n / count, the
// first n % count of them one wider, in order), so a sample is sorted, distinct and spread over the
// whole set. Draw i is splitmix64 at the (i + 1)-th stride from a start that hashes (seed, step),
// scaled to its stratum's width by a 64x64->128 multiply (bias below width / 2^64): each draw
// stands alone, so one thread per draw computes it. The start is hashed because splitmix64 walks
// its state by a fixed stride: nearby starts (seed ^ step) would draw overlapping sequences.
inline constexpr uint64_t kSplitmixStride = 0x9E3779B97F4A7C15ull;

DSA_HD uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

DSA_HD uint64_t audit_sample_start(uint64_t seed, int64_t step) {
  return splitmix64_mix(seed ^ splitmix64_mix(uint64_t(step) + kSplitmixStride));
}

// The position of draw i (0 <= i < count < n); width = n / count, wider = n % count.
DSA_HD int64_t audit_sample_position(uint64_t start, int64_t i, int64_t width, int64_t wider) {
  const uint64_t r = splitmix64_mix(start + uint64_t(i + 1) * kSplitmixStride);
  const uint64_t w = uint64_t(width + (i < wider ? 1 : 0));
  const int64_t lo = i * width + (i < wider ? i : wider);
#if defined(__CUDA_ARCH__)
  return lo + int64_t(__umul64hi(r, w));
#else
  return lo + int64_t((static_cast<unsigned __int128>(r) * w) >> 64);
#endif
}

// The digest a slot will have once these values are stored in a pool of this layout: the values
// go through the writers' own encoder into a token-sized buffer, then through slot_digest. This
// is the auditor's truth for a written slot: what the row meant to write, never a read-back.
DSA_HD uint64_t index_k_values_digest(KvDtype dtype, ScaleRounding rounding,
                                      const float* k /*[128]*/) {
  alignas(16) uint8_t values[kIndexHeadDim * 2];
  float scale = 0.0f;
  encode_index_k_bytes(dtype, rounding, k, values, &scale);
  if (dtype == KvDtype::kBf16) return slot_digest({values, kIndexHeadDim * 2, nullptr, 0});
  return slot_digest({values, kIndexHeadDim, reinterpret_cast<const uint8_t*>(&scale), 4});
}

DSA_HD uint64_t latent_values_digest(KvDtype dtype, ScaleRounding rounding,
                                     const float* c /*[512]*/, const float* k_rope /*[64]*/) {
  alignas(16) uint8_t bytes[kLatentDim * 2];
  encode_latent_bytes(dtype, rounding, c, k_rope, bytes);
  return slot_digest({bytes, latent_token_bytes(dtype), nullptr, 0});
}

}  // namespace dsa
