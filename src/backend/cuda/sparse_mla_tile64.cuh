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
  constexpr int kTokensPerPass = kThreads / 8;
  static_assert(kTokens % kTokensPerPass == 0);
  const int c = t % 8;
#pragma unroll
  for (int pass = 0; pass < kTokens / kTokensPerPass; ++pass) {
    const int token = t / 8 + pass * kTokensPerPass;
    const int64_t slot = slots[token];
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
