// The indexer logits kernel, variant "wgmma-pipe" (DSA_CUDA_INDEXER_VARIANT=wgmma-pipe; fp8 only,
// bf16 runs the "wgmma" kernel). What it computes, its guards and its arithmetic:
// indexer_wgmma.cu's header, whose shared pieces (the copies, the block span, the query, the
// launch) are in indexer_wgmma.cuh.
//
// Measured on the H200, the fp8 schedule of "wgmma" runs each step after the other (wait, widen
// into the f16 tile, fence, barrier, wgmma, wait, epilogue through shared memory) and moves 896 B
// of shared memory per token: 45% of copy bandwidth at B = 64. This schedule computes the tile the
// other way round, S^T[64 tokens x 64 heads] = K . Q^T (m64n64k16.f16, one page per tile):
//   - A = the keys, from registers: each thread widens its fragments (rows 16 warp + g and + 8,
//     dims 16 s + 2 q (+ 1) and 16 s + 8 + 2 q (+ 1) of k16 step s) straight from the raw stage
//     with one 2-byte load and one cvt.f16x2.e4m3x2 per register. No f16 tile: no f16 stores,
//     no wgmma read of them, no proxy fence or barrier for them. The raw stage stores chunk c of
//     token row r at 16-byte position c ^ (r % 8), so a load's 8 lane groups (8 rows) hit 8
//     distinct bank groups.
//   - B = the query, the same swizzled bytes as A above (rows = heads, K-major).
//   - Overlap inside a block: tile i's 8 wgmma are issued, then tile i + 1 is waited for, its
//     copies' successor queued and its keys widened into the other register set (two sets,
//     alternated by an unrolled pair of tiles: ptxas would serialize the wgmma, C7513, if a copy
//     let it merge them), then the wait, then the epilogue. The group never crosses the loop's
//     back edge. Three blocks per SM fill the rest (the epilogue, the barrier).
//   - The epilogue in registers: a thread holds 2 tokens x 16 heads (heads 8 j + 2 q + e), i.e.
//     for each head group hw the pairs (16 hw + g', + 8) of g' = 2 q + e: x(g') as in 2. above,
//     then x(2 q) + x(2 q + 1), shuffles xor 1 (a reduce-scatter over the two tokens) and xor 2
//     give the tree of 3., and the head groups (W0 + W1) + (W2 + W3) are the thread's own: no
//     shared memory, no barrier. The scales go to registers when the tile is widened, so the
//     stage is free for the copies of tile i + kStages as soon as every thread has widened it.
//   Bits: every element is the same chain of 8 k16 blocks from +0 of the same f16 values, and
//   the head sum the same operations in the same order (a + b is commutative bit for bit), so
//   the logits are those of "wgmma"; that the tensor core sums an element's products alike
//   whichever operand is A (and from registers or shared memory) is what the parity test
//   IndexerLogitsWgmmaPipeAgreesBitwise checks, bit for bit against "wgmma".
//   Shared memory: query 16 KiB + 6 raw stages of 8.25 KiB (5 pages, 40 KiB, in flight while one
//   is widened) + weights and page ids + 1 KiB of alignment = 67.25 KiB: three blocks per SM,
//   120 KiB of copies in flight per SM. 163 registers (<= 170 for three), no spills.
//   Napkin per fp8 token per SM: HBM 7.7 clk; shared memory 128 B (cp.async) + the widening's
//   loads (2 wavefronts per 8 rows' half chunks: 2 clk) + 256 B (the query as B: 2 KiB per
//   instruction over 64 tokens) = ~5 clk (was 7); cvt 4 clk; wgmma 4 clk (8 m64n64k16 per 64
//   tokens at 32 clk each); issue ~2.6 clk (widening ~1.2, epilogue ~1.4). B = 64, L = 32K
//   (15.9K tokens per SM): 64 us of HBM against ~42 us of shared memory and 34 us of cvt or
//   wgmma, overlapped: 70-80 us expected (target <= 95). B = 1, L = 128K: 256 blocks of 8 tiles
//   all resident (396 slots), 5 pages each in flight from the start: ~6-7 us.
#include "backend/cuda/indexer_wgmma.cuh"
#include "backend/cuda/pdl.h"

namespace dsa::cuda::indexer_detail {
namespace {

// The shared-memory layout of "wgmma-pipe": the query (B, two swizzled K blocks of 64 dims), the
// raw ring (a stage: one page's 64 token rows of 128 e4m3 bytes, chunk c of row r at 16-byte
// position c ^ (r % 8), then the page's 64 scales), the weights, the block's page ids.
struct PipeTile {
  static constexpr bool kFp8 = true;
  static constexpr int kPages = 1;
  static constexpr int kN = kPageSize;  // tokens per tile: the wgmma M
  static constexpr int kStages = 6;     // 5 pages in flight while one is widened
  static constexpr int kBlocksPerSm = 3;
  static constexpr int kRawKeyBytes = kN * kIndexHeadDim;
  static constexpr int kStageBytes = kRawKeyBytes + kN * 4;
  static constexpr int kQueryOff = 0;
  static constexpr int kRingOff = 2 * kQueryKBlockBytes;
  static constexpr int kWeightOff = kRingOff + kStages * kStageBytes;
  static constexpr int kPagesOff = kWeightOff + kMaxHeads * 4;
  static constexpr int kSmemBytes =
      kPagesOff + kMaxBlockTokens / kPageSize * 4 + kSwizzleAtomBytes;  // + alignment slack
  static_assert(kStageBytes % 16 == 0 && kRingOff % 16 == 0);
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "kBlocksPerSm CTAs per SM");
  static_assert(kMinBlockTokens % kN == 0, "blocks are whole tiles");
};

// Two e4m3 bytes (the lower dim in the lower byte) widened exactly to an f16 pair.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t pair) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(pair));
  return r;
}

// This thread's A fragments of a raw stage (rows r = 16 warp + g and r + 8 of the tile, the
// register-A layout of wgmma.cuh): for k16 step s, a[s] = the f16 pairs of dims 16 s + 2 q (+ 1)
// of rows r, r + 8, then of dims 16 s + 8 + 2 q (+ 1) of rows r, r + 8; and the two rows' scales.
// Both rows have r % 8 = g, so chunk s of either sits at position s ^ g: the 8 lane groups of a
// load hit 8 distinct 16-byte bank groups, the 4 lanes of one group two words of one of them.
__device__ __forceinline__ void widen_fragments(const uint8_t* stage, int warp, int g, int qd,
                                                uint32_t (&a)[kKSteps][4], float (&scale)[2]) {
  const uint8_t* row0 = stage + (16 * warp + g) * kIndexHeadDim + 2 * qd;
  const uint8_t* row1 = row0 + 8 * kIndexHeadDim;
#pragma unroll
  for (int s = 0; s < kKSteps; ++s) {
    const int pos = (s ^ g) * 16;
    a[s][0] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(row0 + pos));
    a[s][1] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(row1 + pos));
    a[s][2] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(row0 + pos + 8));
    a[s][3] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(row1 + pos + 8));
  }
  const float* scales = reinterpret_cast<const float*>(stage + PipeTile::kRawKeyBytes);
  scale[0] = scales[16 * warp + g];
  scale[1] = scales[16 * warp + g + 8];
}

__global__ void __launch_bounds__(kWgThreads, PipeTile::kBlocksPerSm)
    indexer_logits_wgmma_pipe(IndexerLogitsParams p, BlockPlan plan) {
  pdl_enter();
  using T = PipeTile;
  constexpr int kStages = T::kStages;
  const int row = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  RingBlock<T, true> b;
  QueryLoad<kWgWarps> q;
  if (!b.start(p, plan, smem_raw, q)) return;

  // The query into B (rows = heads, K-major: the bytes "wgmma" uses as A).
  store_query<KvDtype::kFp8>(q, b.smem + T::kQueryOff, b.weight);

  const int g = lane / 4, qd = lane % 4;
  // Tile i: wait for its copies (this thread's, then everyone's at the barrier, which also says
  // every thread has widened tile i - 1), queue tile i + kStages - 1 into the stage tile i - 1
  // left, widen tile i into registers. Group accounting: kStages - 1 groups before the first
  // call, one per call, so at call i tiles 0 .. i are complete when <= kStages - 2 are pending.
  auto widen = [&](int i, uint32_t(&a)[kKSteps][4], float(&scale)[2]) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    b.issue(p, i + kStages - 1);
    widen_fragments(b.stage(i), warp, g, qd, a, scale);
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
#pragma unroll
      for (int j = 0; j < 4; ++j) fence_operand(a[s][j]);
    }
  };
  uint32_t a[kKSteps][4], a_odd[kKSteps][4];  // tiles 2 k and 2 k + 1
  float scale[2], scale_odd[2];
  widen(0, a, scale);  // its barrier also publishes the query and the weights
  const StWeights w(b.weight);

  float* logits = p.logits + int64_t(row) * p.ld_logits;
  // Tile i, whose A registers `a` are widened; widens tile i + 1 into `a_next`. The loop below
  // alternates two register sets instead of copying one into the other: a copy lets ptxas give
  // both the same registers, and it then serializes the wgmma (C7513).
  auto step = [&](int i, const uint32_t(&a)[kKSteps][4], const float(&scale)[2],
                  uint32_t(&a_next)[kKSteps][4], float(&scale_next)[2]) {
    // 1. S^T of tile i: D[token][head], the 8 k16 steps ascending from +0.
    float acc[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[j] = 0.0f;
      fence_operand(acc[j]);
    }
    wgmma_fence();  // the zeroed accumulators and the widened A registers
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_f16_rs64(acc, a[4 * kb + kk],
                       wgmma_desc_sw128(b.base + T::kQueryOff + kb * kQueryKBlockBytes + 32 * kk));
      }
    }
    wgmma_commit();
    // Tile i + 1 is widened while tile i's wgmma run (into other registers; past the last tile
    // the stage read is stale and its values unused; the copies queued are empty groups).
    widen(i + 1, a_next, scale_next);
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 32; ++j) fence_operand(acc[j]);

    // 2. The relu, the weights, the head sum, the token scale: st_epilogue (indexer_wgmma.cuh).
    float relu[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) relu[j] = fmaxf(acc[j], 0.0f);
    st_epilogue(p, logits, b.tile_pages(i)[0], b.tile_t0(i), b.end, relu, scale, w);
  };
  for (int i = 0; i < b.tiles; i += 2) {
    step(i, a, scale, a_odd, scale_odd);
    if (i + 1 < b.tiles) step(i + 1, a_odd, scale_odd, a, scale);
  }
  cp_async_wait<0>();  // nothing in flight past here (the trailing groups are empty)
}

}  // namespace

cudaError_t launch_wgmma_pipe(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return launch_blocks(&indexer_logits_wgmma_pipe, PipeTile::kSmemBytes, opted, p, block_tokens,
                       stream);
}

}  // namespace dsa::cuda::indexer_detail
