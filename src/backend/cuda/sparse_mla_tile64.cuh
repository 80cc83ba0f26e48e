// The tile of the 64-token sparse MLA kernels (sparse_mla_wgmma64.cu and its warp-specialized
// form, sparse_mla_ws.cu): 64 heads and 64 selected tokens per step in two warpgroups, q and two
// chunk tiles in 128-byte-swizzled 64-dim tiles (wgmma.cuh), slots staged as int32. Both kernels
// run the same arithmetic on this tile; only the warpgroups' roles differ.
#pragma once

#include <cstddef>

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

}  // namespace dsa::cuda::sparse_mla_tile64
