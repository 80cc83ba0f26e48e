// The indexer logits kernel, variant "wgmma-e4m3" (DSA_CUDA_INDEXER_VARIANT=wgmma-e4m3; fp8 caches
// only, bf16 ones run "wgmma"). What it computes and its guards: indexer_wgmma.cu's header; the
// copies, the block span, the query load and the launch: indexer_wgmma.cuh.
//
// "wgmma-pipe" widens every key byte to f16 (a cvt and a shared load per pair, in registers) so
// that the f16 tensor core sums the products in f32. Its napkin puts the widening at 6 of its ~12
// SM cycles per token, and the H200 agrees (B = 64, L = 32K: 107 us against 65 us of HBM). This
// variant multiplies the e4m3 bytes as they land: S^T[64 tokens x 64 heads] = K . Q^T as four
// wgmma m64n64k32.f32.e4m3.e4m3, both operands K-major from shared memory (the raw stage is
// already the 128-byte-swizzled layout: chunk c of row r at 16-byte position c ^ (r % 8), one
// 128-byte row per token), nothing widened, no A registers.
//   Arithmetic: the same products (e4m3 x e4m3 is exact in the tensor core), summed by the fp8
//   tensor core, whose accumulator keeps 13 mantissa bits inside an instruction's 32 products
//   (aligned to their largest, truncated) and between instructions. So its bits are its own, not
//   "wgmma"'s: held to the CPU's bound for this variant (the parity tests' kLogitsE4m3Nmse) and
//   bitwise to itself across batches and block sizes. Every element's chain is the same four
//   instructions from scale-d = 0, and the head sum the epilogue of "wgmma-pipe", in the same
//   order whatever the block, row or batch.
//   Schedule: tile i's four wgmma run while tile i - 1's epilogue (weights, head sum, the token
//   scale) runs from the relu of the other accumulator set, taken before the wgmma are issued; the
//   copies of tile i + kStages - 1 are queued into the stage tile i - 1 left as soon as the barrier
//   says every warp's wgmma on it is done. A stage is 9 KiB (the 8 KiB of keys 1024-aligned for the
//   descriptor, then the scales), the tile's two scales per thread go to registers before the stage
//   is reused. Shared memory: query 8 KiB + 6 stages of 9 KiB + weights and page ids + 1 KiB of
//   alignment = 63.75 KiB: three blocks per SM, 3 x 5 pages = 124 KiB of copies in flight per SM.
//   The deeper rings (E4m3Tile, DSA_CUDA_INDEXER_RING): 9 stages at two blocks per SM (90.75 KiB)
//   and 17 at one (162.75 KiB), their blocks sized to fill the GPU once.
//   157 registers (165 before the given-query path), no spills (four blocks per SM would cap them
//   at 128: it spills). Napkin per
//   token per SM: HBM 7.7 clk at B = 64; shared memory 128 B written (cp.async) and 256 B read by
//   the tensor core (A once, B per instruction: 64 x 32 B x 4 per 64 tokens) = 3 clk; tensor core 2
//   clk (m64n64k32 e4m3 at 4096 FMA/clk: 32 clk, four per 64 tokens); issue ~1.5 clk (the
//   epilogue). B = 64, L = 32K: HBM-bound, ~70 us expected; B = 1, L = 128K: the blocks' start
//   (query, page ids) then ~2 tiles of HBM latency each.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/env_knobs.h"
#include "backend/cuda/indexer_wgmma.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"

namespace dsa::cuda::indexer_detail {
namespace {

// The shared-memory layout: the query (B: 64 heads x 128 e4m3 bytes, 128-byte swizzled), the
// ring (a stage: 64 token rows of 128 bytes, chunk c of row r at 16-byte position c ^ (r % 8),
// then the page's 64 scales, then padding to keep the next stage 1024-aligned), the weights, the
// block's page ids. issue_tile<E4m3Tile, true> fills a stage.
// The ring's depth (kStages, kBlocksPerSm), e4m3_ring below: 6 stages and three blocks per SM
// (five pages in flight per block); 9 and two (a 512-token block's eight pages all queued by its
// opening); 17 and one (sixteen). Nothing but the timing of the copies differs: each tile's
// wgmma and epilogue are the same instructions in the same order, so the same bits.
template <int kStagesT, int kBlocksPerSmT>
struct E4m3Tile {
  static constexpr bool kFp8 = true;
  static constexpr int kPages = 1;
  static constexpr int kN = kPageSize;  // tokens per tile: the wgmma M
  static constexpr int kStages = kStagesT;
  static constexpr int kBlocksPerSm = kBlocksPerSmT;
  static constexpr int kRawKeyBytes = kN * kIndexHeadDim;  // the scales' offset in a stage
  static constexpr int kStageBytes = kRawKeyBytes + kSwizzleAtomBytes;
  static constexpr int kQueryOff = 0;
  static constexpr int kRingOff = kMaxHeads * kIndexHeadDim;
  static constexpr int kWeightOff = kRingOff + kStages * kStageBytes;
  static constexpr int kPagesOff = kWeightOff + kMaxHeads * 4;
  static constexpr int kSmemBytes =
      kPagesOff + kMaxBlockTokens / kPageSize * 4 + kSwizzleAtomBytes;  // + alignment slack
  static_assert(kN * 4 <= kSwizzleAtomBytes, "a page's scales fit behind its keys");
  static_assert(kRingOff % kSwizzleAtomBytes == 0 && kStageBytes % kSwizzleAtomBytes == 0);
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "kBlocksPerSm CTAs per SM");
  static_assert(kMinBlockTokens % kN == 0, "blocks are whole tiles");
};
using E4m3Ring6 = E4m3Tile<6, 3>;
using E4m3Ring9 = E4m3Tile<9, 2>;
using E4m3Ring17 = E4m3Tile<17, 1>;

template <class T>
__global__ void __launch_bounds__(kWgThreads, T::kBlocksPerSm)
    indexer_logits_wgmma_e4m3(IndexerLogitsParams p, BlockPlan plan) {
  pdl_enter();
  constexpr int kStages = T::kStages;
  const int row = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  RingBlock<T, true> b;
  QueryLoad<kWgWarps> q;
  const bool given = p.q_fp8 != nullptr;  // the launcher passes it only when it may be read
  if (!b.start(p, plan, smem_raw, q, !given)) return;
  if (given) {
    store_given_query(p, row, b.smem + T::kQueryOff, b.weight);
  } else {
    store_query<KvDtype::kFp8, true>(q, b.smem + T::kQueryOff, b.weight);
  }

  __syncthreads();  // the query and the weights are published
  const int g = lane / 4;
  const StWeights w(b.weight);
  float* logits = p.logits + int64_t(row) * p.ld_logits;

  // Tile i: wait for its copies (this thread's, then everyone's at the barrier, which also says
  // every warp's wgmma on tile i - 1 is done), queue tile i + kStages - 1 into the stage tile
  // i - 1 left, read tile i's scales, run its four wgmma into `acc` while tile i - 1's epilogue
  // (st_epilogue, indexer_wgmma.cuh: the one of "wgmma-pipe") runs from `prev`. Group accounting:
  // kStages - 1 copy groups before the first call, one per call, so at call i tiles 0 .. i are
  // complete when <= kStages - 2 are pending. Two register sets alternated by an unrolled pair of
  // calls (a copy between them would let ptxas merge them and serialize the wgmma).
  auto step = [&](int i, float(&acc)[32], float(&scale)[2], const float(&prev)[32],
                  const float(&prev_scale)[2]) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async();  // this thread's landed copies, to the tensor core's proxy
    __syncthreads();
    b.issue(p, i + kStages - 1);
    const float* scales = reinterpret_cast<const float*>(b.stage(i) + T::kRawKeyBytes);
    scale[0] = scales[16 * warp + g];
    scale[1] = scales[16 * warp + g + 8];
    // Tile i - 1's relu, taken before the wgmma are issued: ptxas makes a read of the other
    // accumulator set while a wgmma is in flight wait for it (C7517), a read of a copy it does not.
    float relu[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      relu[j] = fmaxf(prev[j], 0.0f);
      fence_operand(relu[j]);
    }
    wgmma_fence();
    const uint32_t a = b.base + b.stage_offset(i), q_tile = b.base + T::kQueryOff;
#pragma unroll
    for (int kk = 0; kk < kIndexHeadDim / 32; ++kk) {
      wgmma_e4m3<64>(acc, wgmma_desc_sw128(a + 32 * kk), wgmma_desc_sw128(q_tile + 32 * kk),
                     kk > 0);
    }
    wgmma_commit();
    if (i > 0) {
      st_epilogue(p, logits, b.tile_pages(i - 1)[0], b.tile_t0(i - 1), b.end, relu, prev_scale, w);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 32; ++j) fence_operand(acc[j]);
  };

  float acc[32], acc_odd[32], scale[2], scale_odd[2];
  for (int i = 0; i < b.tiles; i += 2) {
    step(i, acc, scale, acc_odd, scale_odd);
    if (i + 1 < b.tiles) step(i + 1, acc_odd, scale_odd, acc, scale);
  }
  // The last tile's epilogue (its set: acc when the count is odd).
  auto last = [&](const float(&set)[32], const float(&set_scale)[2]) {
    float relu[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) relu[j] = fmaxf(set[j], 0.0f);
    st_epilogue(p, logits, b.tile_pages(b.tiles - 1)[0], b.tile_t0(b.tiles - 1), b.end, relu,
                set_scale, w);
  };
  if (b.tiles % 2) {
    last(acc, scale);
  } else {
    last(acc_odd, scale_odd);
  }
  cp_async_wait<0>();  // nothing in flight past here (the trailing groups are empty)
}

// Whether the blocks read the query's encoding that indexer_query wrote (p.q_fp8) instead of
// encoding q themselves: DSA_CUDA_INDEXER_Q=given (read at every call), where it is there and
// 4-byte aligned; unset or "encode": every block encodes the row's q, until "given" has run on the
// H200. Nsight Compute put about 40% of a B = 1, L = 128K launch's stall samples in that encoding
// (256 blocks, each encoding the row's 64 heads: bench/results/2026-12-04-h200-indexer-e4m3.md);
// a given query is 8 KiB of bytes and 64 scales a block. The same bytes, so the same bits.
bool reads_given_query(const IndexerLogitsParams& p) {
  if (!indexer_reads_given_query()) return false;
  return p.q_fp8 != nullptr && p.q_fp8_scale != nullptr &&
         p.ld_q_fp8 >= int64_t(p.heads) * kIndexHeadDim && p.ld_q_fp8 % 4 == 0 &&
         reinterpret_cast<uintptr_t>(p.q_fp8) % 4 == 0;
}

// The ring's depth: DSA_CUDA_INDEXER_RING forced (6, 9 or 17 stages; read at every call), else 0
// (auto, launch_wgmma_e4m3 below). Deeper rings hold fewer blocks per SM.
int e4m3_ring() {
  const char* v = std::getenv("DSA_CUDA_INDEXER_RING");
  if (v != nullptr &&
      (std::strcmp(v, "6") == 0 || std::strcmp(v, "9") == 0 || std::strcmp(v, "17") == 0)) {
    return std::atoi(v);
  }
  return 0;
}

// Tokens per block for a ring of `per_sm` blocks per SM, where the caller's size was the batch's
// choice (not DSA_CUDA_INDEXER_BLOCK_TOKENS): the fewest whole tiles (at least two) that put
// every row's blocks into one wave of per_sm blocks per SM, at most kMaxBlockTokens.
int one_wave_block_tokens(const IndexerLogitsParams& p, int per_sm) {
  const int64_t slots = int64_t(per_sm) * std::max(device_sm_count(), 1);
  const int64_t row_tiles = (p.ld_logits + kPageSize - 1) / kPageSize;
  int64_t tiles = std::max<int64_t>(2, (int64_t(p.rows) * row_tiles + slots - 1) / slots);
  while (tiles * kPageSize < kMaxBlockTokens &&
         int64_t(p.rows) * ((row_tiles + tiles - 1) / tiles) > slots) {
    ++tiles;
  }
  return int(std::min<int64_t>(tiles * kPageSize, kMaxBlockTokens));
}

template <class T>
cudaError_t launch_ring(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return launch_blocks(&indexer_logits_wgmma_e4m3<T>, T::kSmemBytes, opted, p, block_tokens,
                       stream);
}

}  // namespace

cudaError_t launch_wgmma_e4m3(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  IndexerLogitsParams launched = p;
  if (!reads_given_query(p)) launched.q_fp8 = nullptr, launched.q_fp8_scale = nullptr;
  const bool forced = std::getenv("DSA_CUDA_INDEXER_BLOCK_TOKENS") != nullptr;
  int ring = e4m3_ring();
  // auto: 9 stages where the 6-stage launch would take more than one wave (B = 64, L = 32K: 1024
  // blocks of 2048 tokens for 396 places; 9 stages run 256 blocks of 8192 in one wave: 106.3 us in
  // a graph against 115.1 on an H100, bench/results/2026-12-07-h100-ring.md), else 6 (B = 1,
  // L = 128K: 256 blocks, one wave: 12.8 us against 13.0 at 9 and 15.3 at 17). Only the timing of
  // the copies differs, so the bits are the same either way, and the choice may follow the batch.
  if (ring == 0) {
    const int64_t blocks =
        int64_t(p.rows) * ((p.ld_logits + block_tokens - 1) / std::max(block_tokens, 1));
    const int64_t places = int64_t(E4m3Ring6::kBlocksPerSm) * std::max(device_sm_count(), 1);
    ring = !forced && blocks > places ? 9 : 6;
  }
  if (ring == 6) return launch_ring<E4m3Ring6>(launched, block_tokens, stream);
  if (ring == 9) {
    const int tokens = forced ? block_tokens : one_wave_block_tokens(p, E4m3Ring9::kBlocksPerSm);
    return launch_ring<E4m3Ring9>(launched, tokens, stream);
  }
  const int tokens = forced ? block_tokens : one_wave_block_tokens(p, E4m3Ring17::kBlocksPerSm);
  return launch_ring<E4m3Ring17>(launched, tokens, stream);
}

}  // namespace dsa::cuda::indexer_detail
