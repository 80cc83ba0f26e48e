// The tile of the 64-token sparse MLA kernels (sparse_mla_wgmma64.cu and its warp-specialized
// form, sparse_mla_ws.cu): 64 heads and 64 selected tokens per step in two warpgroups, q and two
// chunk tiles in 128-byte-swizzled 64-dim tiles (wgmma.cuh), slots staged as int32. Both kernels
// run the same arithmetic on this tile; only the warpgroups' roles differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "backend/cuda/mma.cuh"
#include "backend/cuda/sparse_mla_load.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda::sparse_mla_tile64 {

using sparse_mla_detail::dequant_pair;
using sparse_mla_detail::kPartPitch;

constexpr int kHeadsPerCta = 64;                    // one wgmma M
constexpr int kThreadsPerCta = 256;                 // two warpgroups
constexpr int kTokens = 64;                         // selected tokens per chunk
constexpr int kTiles64 = kLatentDim / 64;           // 9 swizzled 64-dim tiles per row
constexpr int kTileBytes = 64 * kSwizzleRowBytes;   // 8 KiB: [64 heads or tokens][64 dims]
constexpr int kQBytes = kTiles64 * kTileBytes;      // 72 KiB
constexpr int kChunkBytes = kTiles64 * kTileBytes;  // 72 KiB
constexpr int kRing = 2;                            // chunk tiles: 1 landing, 1 computed
constexpr int kSlotStages = 3;                      // slot stages (each kernel says how they turn)
constexpr int kScoreSteps = kLatentDim / 16;        // 36 k16 steps of S
constexpr int kOutTiles = kKvLoraRank / 2 / 64;     // 4 n64 tiles of O per warpgroup
constexpr int kPvSteps = kTokens / 16;              // 4 k16 steps of P V
constexpr size_t kPartBytes = size_t(kHeadsPerCta) * kPartPitch * 4;  // the partial o
static_assert(kKvLoraRank % 128 == 0 && kLatentDim % 64 == 0);

// The tokens of a chunk's copies by kThreads threads, eight per token: f(token, slot) for tokens
// t / 8 + (kThreads / 8) i of the chunk's staged slots [64] (t: the thread's index among them).
template <int kThreads, class F>
__device__ __forceinline__ void for_each_copied_token(const int32_t* slots, int t, F&& f) {
  constexpr int kTokensPerPass = kThreads / 8;
  static_assert(kTokens % kTokensPerPass == 0);
#pragma unroll
  for (int pass = 0; pass < kTokens / kTokensPerPass; ++pass) {
    const int token = t / 8 + pass * kTokensPerPass;
    f(token, int64_t(slots[token]));
  }
}

// The copies of one chunk into its tile by kThreads threads (t: the thread's index among them),
// from the chunk's staged slots [64]: cp.async for every 16-byte piece of a used token's row,
// zeros for the unused ones (-1: never read). Eight threads per token: thread t copies 16-byte
// chunk t % 8 of each of the 9 tile rows of tokens t / 8 + (kThreads / 8) i (4 tokens, 36 pieces
// with 128 threads; 2 and 18 with 256). A quarter warp writes the 8 chunks of one tile row (8
// distinct bank groups under any swizzle row) and reads 128 contiguous bytes of the pool. The
// caller commits the group.
template <int kThreads>
__device__ __forceinline__ void fetch_chunk(const SparseMlaParams& p, const int32_t* slots,
                                            uint8_t* tile, int t) {
  const int c = t % 8;
  for_each_copied_token<kThreads>(slots, t, [&](int token, int64_t slot) {
    uint8_t* dst = tile + swizzle128_offset(token, c);
    const uint8_t* src = p.pool.data + (slot >= 0 ? slot : 0) * (kLatentDim * 2) + c * 16;
#pragma unroll
    for (int b = 0; b < kTiles64; ++b) {  // tile b: dims [64 b, 64 b + 64) of the token
      if (slot >= 0) {
        cp_async16(dst + b * kTileBytes, src + b * kSwizzleRowBytes);
      } else {
        *reinterpret_cast<uint4*>(dst + b * kTileBytes) = make_uint4(0, 0, 0, 0);
      }
    }
  });
}

// fp8 caches (the ws kernel): a chunk's raw bytes land inside its own bf16 tile and are expanded
// there, so the ring needs no raw stage (q and two bf16 tiles fill shared memory). Each token's raw
// bytes sit in that token's own rows, so a warp expands the tokens it copied with no other warp
// involved: in 64-dim tile b (b < 8) of token row r, the 64 e4m3 values of dims [64 b, 64 b + 64)
// as four 16-byte pieces in logical 16-byte chunks 4..7 of the row (even b) or 0..3 (odd b: then
// a warp's reads and copies cover all eight bank groups of a row), the token's four f32 scales in
// logical chunk 0 of its tile-0 row (free: tile 0 is even), and the rope, bf16 as stored, in its
// tile-8 row as for bf16 caches. Logical chunk k of row r sits at swizzle128_offset(r, k).
// dequantize_tile() then writes each row's eight bf16 chunks over them.
constexpr int kFp8Pieces = kKvLoraRank / 16;                // 16-byte pieces of e4m3 per token: 32
constexpr int kScalesPerToken = kKvLoraRank / kLatentTile;  // 4
constexpr int kRopeTile = kKvLoraRank / 64;                 // tile 8: dims 512..575
static_assert(kLatentTile == 128 && kScalesPerToken == 4, "one scale per pair of 64-dim tiles");
static_assert(kScalesPerToken * 4 == 16, "a token's scales fill one 16-byte chunk");

// The logical chunk of a token's row in 64-dim tile b that holds e4m3 piece p (dims 64 b + 16 p
// .. + 16) until the row is expanded.
__device__ __forceinline__ constexpr int raw_chunk(int b, int p) { return b % 2 == 0 ? 4 + p : p; }

// The copies of one fp8 chunk into its tile, by kThreads threads, from the chunk's staged slots:
// eight threads per token as fetch_chunk(); thread t copies e4m3 pieces j = c, c + 8, c + 16,
// c + 24 (c = t % 8: a quarter warp reads 128 contiguous bytes of the token; piece j is piece j % 4
// of tile j / 4), rope piece c, and with c = 0 the token's scales. Unused tokens (-1) get zeros
// everywhere: e4m3 0 times scale 0 is +0, the bf16 kernel's zero rows. The caller commits the
// group.
template <int kThreads>
__device__ __forceinline__ void fetch_chunk_fp8(const SparseMlaParams& p, const int32_t* slots,
                                                uint8_t* tile, int t) {
  const int c = t % 8;
  auto copy = [](uint8_t* dst, const uint8_t* src, bool used) {
    if (used) {
      cp_async16(dst, src);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  };
  for_each_copied_token<kThreads>(slots, t, [&](int token, int64_t slot) {
    const bool used = slot >= 0;
    const uint8_t* src = p.pool.data + (used ? slot : 0) * kLatentFp8TokenBytes;
#pragma unroll
    for (int i = 0; i < kFp8Pieces / 8; ++i) {
      const int j = c + 8 * i, b = j / 4;
      copy(tile + b * kTileBytes + swizzle128_offset(token, raw_chunk(b, j % 4)), src + j * 16,
           used);
    }
    copy(tile + kRopeTile * kTileBytes + swizzle128_offset(token, c),
         src + kLatentFp8RopeOffset + c * 16, used);
    if (c == 0) copy(tile + swizzle128_offset(token, 0), src + kLatentFp8ScaleOffset, used);
  });
}

// The bf16 rows of an fp8 chunk from its raw bytes, in place, by the kThreads threads that copied
// it (fetch_chunk_fp8's token mapping: a token's eight threads are eight lanes of one warp), once
// each has waited for its own copies: c = bf16(e4m3 * scale) as dequant_pair() (the wgmma kernel's
// values, bit for bit), the rope as copied. Per token, thread t expands the pieces it copied
// (piece c % 4 of tiles c / 4, c / 4 + 2, + 4, + 6): it reads them and the token's scales, the
// warp syncs (every lane of the token has read what the row's writes will cover), then it writes
// logical chunks 2 (c % 4) and 2 (c % 4) + 1 of each tile's row. A row is written only by the warp
// that reads it, so nothing outside the warp takes part; a write instruction's 32 lanes cover the
// eight bank groups four times, as do the reads.
template <int kThreads>
__device__ __forceinline__ void dequantize_tile(uint8_t* tile, int t) {
  constexpr int kTokensPerPass = kThreads / 8;
  static_assert(kThreads % 32 == 0 && kTokens % kTokensPerPass == 0);
  const int c = t % 8, piece = c % 4;
  __syncwarp();  // every lane's copies (waited for by each lane) -> every lane of the warp
#pragma unroll
  for (int pass = 0; pass < kTokens / kTokensPerPass; ++pass) {
    const int token = t / 8 + pass * kTokensPerPass;
    const uint4 sc = *reinterpret_cast<const uint4*>(tile + swizzle128_offset(token, 0));
    const float scales[kScalesPerToken] = {__uint_as_float(sc.x), __uint_as_float(sc.y),
                                           __uint_as_float(sc.z), __uint_as_float(sc.w)};
    uint4 raw[kScalesPerToken];  // [i]: tile c / 4 + 2 i, whose scale is scales[i]
#pragma unroll
    for (int i = 0; i < kScalesPerToken; ++i) {
      const int b = c / 4 + 2 * i;
      raw[i] = *reinterpret_cast<const uint4*>(tile + b * kTileBytes +
                                               swizzle128_offset(token, raw_chunk(b, piece)));
    }
    __syncwarp();  // the token's raw bytes and scales are read by all eight of its lanes
#pragma unroll
    for (int i = 0; i < kScalesPerToken; ++i) {
      const float s = scales[i];
      const uint4 v = raw[i];  // dims 64 b + 16 piece + [0, 16)
      const uint4 lo =
          make_uint4(dequant_pair(uint16_t(v.x), s), dequant_pair(uint16_t(v.x >> 16), s),
                     dequant_pair(uint16_t(v.y), s), dequant_pair(uint16_t(v.y >> 16), s));
      const uint4 hi =
          make_uint4(dequant_pair(uint16_t(v.z), s), dequant_pair(uint16_t(v.z >> 16), s),
                     dequant_pair(uint16_t(v.w), s), dequant_pair(uint16_t(v.w >> 16), s));
      uint8_t* row = tile + (c / 4 + 2 * i) * kTileBytes;
      *reinterpret_cast<uint4*>(row + swizzle128_offset(token, 2 * piece)) = lo;
      *reinterpret_cast<uint4*>(row + swizzle128_offset(token, 2 * piece + 1)) = hi;
    }
  }
}

// S [64 heads x kN tokens] over all 576 dims, in k order: step i reads k16 block i % 4 of 64-dim
// tile i / 4 of q and of the chunk (both tiles 8 KiB: the same offset from either base
// descriptor). kN = 32 (the 64-token kernel: each warpgroup's half of the chunk) or 64 (the
// warp-specialized one: the whole chunk).
template <int kN, int... kI>
__device__ __forceinline__ void scores(float (&s)[kN / 2], uint64_t desc_q, uint64_t desc_kv,
                                       std::integer_sequence<int, kI...>) {
  constexpr auto at = [](int i) { return ((i / 4) * kTileBytes + (i % 4) * 32) / 16; };
  if constexpr (kN == 32) {
    (wgmma_bf16_n32_at<at(kI), at(kI)>(s, desc_q, desc_kv), ...);
  } else {
    static_assert(kN == 64);
    (wgmma_bf16_n64_at<at(kI), at(kI)>(s, desc_q, desc_kv), ...);
  }
}

}  // namespace dsa::cuda::sparse_mla_tile64
