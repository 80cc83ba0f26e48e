// The indexer logits kernel, variant "wgmma" (DSA_CUDA_INDEXER_VARIANT=wgmma): the scores of all
// 64 heads against a tile of tokens on Hopper warpgroup MMA (wgmma.cuh), S[64 heads x N tokens] =
// Q . K^T, then per token sum_h w_h * relu(S[h, t]) (times k_scale for fp8). The CPU spec and the
// other variants: indexer_logits.cu's header.
//
// Roles. A = the row's query, 64 heads x 128 dims (heads past p.heads are zero with weight 0),
// K-major, written once per CTA into two 128-byte-swizzled K blocks of 64 dims (16 KiB): bf16 for
// a bf16 cache, f16 holding the e4m3 values of the quantized query exactly for fp8. B = a tile of
// N tokens x 128 dims, K-major: exactly the cache's token-major rows. D[h][t] is S in registers
// (the m64nNk16 fragment of wgmma.cuh).
//   - bf16 (N = 64, one page per tile): cp.async writes the page's 16 KiB straight into the
//     swizzled layout of a ring stage, and wgmma.m64n64k16.bf16 reads it from there.
//   - fp8 (N = 128, two pages per tile): cp.async lands the e4m3 bytes and the scales in a raw
//     ring stage (16.5 KiB); the CTA widens them to f16 (the packed cvt, 2 values per
//     instruction, exact) into one swizzled 32 KiB tile, which wgmma.m64n128k16.f16 reads. No e4m3
//     wgmma: its accumulation is narrower than f32.
// One warpgroup per CTA, every thread a producer (cp.async of tile i + kStages - 1 while tile i
// is widened and multiplied) and a consumer; two CTAs per SM (101 KiB fp8, 83 KiB bf16 of shared
// memory; fp8 "wgmma-n64": three of 67 KiB) so that one CTA's widening and epilogue overlap
// another's wgmma. Per tile:
//   wait for tile i's copies, (bf16: fence.proxy.async,) barrier; queue tile i + kStages - 1 into
//   the stage tile i - 1 left; (fp8: widen into the f16 tile, fence.proxy.async, barrier;)
//   wgmma.fence, 8 wgmma (k16 blocks ascending), commit, wait 0; the epilogue.
// Grid: ceil(ld_logits / block_tokens) blocks along each row (indexer_logits.cu's
// block_tokens_for, from the host sizes only: the batch, ld_logits and the SM count), rows along
// y; block x of a row takes the tiles of its own span, or, with DSA_CUDA_INDEXER_TILES=interleaved
// (BlockPlan, indexer_wgmma.cuh), block x of G takes tiles x, x + G, x + 2 G, ..., so that a row
// shorter than ld_logits (the cache's capacity) still spreads over every block. A row of 128K at
// B = 1 runs as 256 blocks of eight tiles over all SMs.
//
// Guards. Nothing at or past the row's seq_len is read: those tokens' copies have a
// source size of 0 (zero-filled), as have the tokens of a page id outside the pool, whose logits
// are 0 and which count one error per page (the CPU's rule). The block's page ids are loaded
// beside seq_len (table entries inside the row's table; those of pages past seq_len are never
// dereferenced). A seq_len 0 row's blocks return at once and write nothing.
//
// Arithmetic, the same for every token whatever B, the block size, the token's place in its tile
// or the heads count (so a logit depends only on its row's inputs and the cache; the parity
// tests check it bit for bit per variant):
//   1. S[h, t] = the chain of 8 wgmma k16 blocks, dims ascending, f32 accumulation from +0 (the
//      instruction is defined element-wise: column t of D sees only row h of A, column t of B and
//      D[h, t]; gemm_wgmma.cu's header, 3.). One instruction shape per dtype.
//   2. The thread holding S[h, t] for heads h = 16 w + g and h + 8 (warp w, lane group g) forms
//      x = fma(w_lo, relu(S_lo), w_hi * relu(S_hi)) (relu: NaN -> 0, as the CPU).
//   3. The 8 lane groups g of a warp: the tree ((g0 + g1) + (g2 + g3)) + ((g4 + g5) + (g6 + g7))
//      (shuffles xor 4, 8, 16 in a reduce-scatter; a + b is commutative bit for bit, so which lane
//      keeps a sum does not matter).
//   4. The 4 warps through shared memory: (W0 + W1) + (W2 + W3); fp8: times k_scale[t].
// It is not the legacy variant's order (that adds a lane's 4 m-tiles first, then the lanes), so
// the bits differ from the mma.sync variants (the tests compare it with the CPU, not bitwise
// with them).
//
// Napkin, H200 (132 SMs, ~1.9 GHz, ~4.2 TB/s copy = 32 B/ns/SM = ~17 B/clk/SM, 128 B/clk/SM of
// shared memory, dense f16/bf16 wgmma ~4096 flop/clk/SM, cvt 16/clk/SM), per fp8 token (132 B,
// 16384 flop):
//   HBM 7.7 clk; wgmma 4 clk (8 m64n128k16 per 128-token tile, 64 clk each at the peak); 64 cvt
//   = 4 clk on the conversion pipe; shared memory 128 (cp.async) + 128 (raw read) + 256 (f16
//   write) + 256 (wgmma's B) + 128 (wgmma's A: 2 KiB per instruction over 128 tokens) = 896 B =
//   7 clk; the epilogue ~2 clk of issue (64 relu, 32 fma, 32 mul, 28 shuffles per thread and
//   tile). A CTA runs these one after another (its wgmma is waited on right after the commit);
//   the second CTA of the SM fills the gaps.
//   fp8 B = 64, L = 32K: 277 MB of keys and scales = 66 us at copy bandwidth; 16.4K tiles =
//   131K wgmma (2.1M tokens, 15.9K per SM: 64 us of HBM, 59 us of shared memory, 34 us of
//   wgmma): expected 75-90 us (target <= 95, i.e. >= 70% of copy). B = 256: 4x that.
//   fp8 B = 1, L = 128K: 17.3 MB = 4.1 us at copy bandwidth; 256 blocks of 4 tiles, one per SM
//   slot, 2 tiles in flight from the start: ~2 us of seq_len / page-id / first-key latency, then
//   ~4 us of bytes: ~6-7 us (target 60% of copy = ~7 us).
//   bf16 (256 B, N = 64: 8 m64n64k16 per page): HBM 15 clk/token against 4 of wgmma and 768 B
//   (6 clk) of shared memory: bandwidth-bound, B = 64, L = 32K ~130 us (537 MB).
//   "wgmma-n64" (fp8 tiles of one page, m64n64k16, 4 stages, 67 KiB, three blocks per SM):
//   wgmma's A reads double (256 B/token: 1024 B = 8 clk of shared memory per token) against a
//   third block to hide the serial steps of each; which wins is the H200's to say.
//
// "wgmma-pipe", the fp8 schedule that widens the keys into wgmma's A registers:
// indexer_wgmma_pipe.cu.
#include "backend/cuda/indexer_wgmma.cuh"
#include "backend/cuda/pdl.h"

namespace dsa::cuda::indexer_detail {
namespace {

// The tile shape and the shared-memory layout, by cache dtype and pages per tile (fp8: 2, or 1
// for "wgmma-n64", which fits three blocks per SM; bf16: 1). Offsets from the 1024-aligned base:
// the query (A, two K blocks), fp8's widened tile (B, two K blocks), the ring, the warps' column
// sums, the weights, the block's page ids.
template <KvDtype D, int kPages_>
struct WgTile {
  static constexpr bool kFp8 = D == KvDtype::kFp8;
  static constexpr int kPages = kPages_;         // pages per tile
  static constexpr int kN = kPages * kPageSize;  // tokens per tile: the wgmma N
  static constexpr int kStages = kPages == 2 ? 3 : 4;
  static constexpr int kBlocksPerSm = kFp8 && kPages == 1 ? 3 : 2;
  static constexpr int kKBlockBytes = kN * kSwizzleRowBytes;  // one K block of a B tile
  static constexpr int kTileBytes = 2 * kKBlockBytes;         // a swizzled B tile
  static constexpr int kRawKeyBytes = kN * kIndexHeadDim;     // fp8: the raw keys, then scales
  static constexpr int kStageBytes = kFp8 ? kRawKeyBytes + kN * 4 : kTileBytes;
  static constexpr int kQueryOff = 0;
  static constexpr int kWideOff = 2 * kQueryKBlockBytes;
  static constexpr int kRingOff = kWideOff + (kFp8 ? kTileBytes : 0);
  static constexpr int kSumsOff = kRingOff + kStages * kStageBytes;
  static constexpr int kWeightOff = kSumsOff + kWgWarps * kN * 4;
  static constexpr int kPagesOff = kWeightOff + kMaxHeads * 4;
  static constexpr int kSmemBytes =
      kPagesOff + kMaxBlockTokens / kPageSize * 4 + kSwizzleAtomBytes;  // + alignment slack
  static_assert(kRingOff % kSwizzleAtomBytes == 0 && kStageBytes % 16 == 0);
  static_assert(kFp8 || kStageBytes % kSwizzleAtomBytes == 0, "bf16 stages are swizzled tiles");
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "kBlocksPerSm CTAs per SM");
  static_assert(kPages == 1 || kPages == 2);
  static_assert(kMinBlockTokens % kN == 0, "blocks are whole tiles");
};

template <KvDtype D, int kN>
__device__ __forceinline__ void wgmma_tile(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (D == KvDtype::kFp8) {
    wgmma_f16<kN>(d, desc_a, desc_b);
  } else {
    wgmma_bf16<kN>(d, desc_a, desc_b);
  }
}

// fp8: the raw keys of a stage widened to f16 into the swizzled tile `wide`. A thread takes 16
// e4m3 (dims [16 c, 16 c + 16) of a token: f16 chunks 2 (c % 4) and 2 (c % 4) + 1 of K block
// c / 4); the second K block's threads write their odd chunk first, so the 8 lanes of a store
// phase hit 8 distinct 16-byte bank groups.
template <class T>
__device__ __forceinline__ void widen_tile(const uint8_t* stage, uint8_t* wide) {
#pragma unroll
  for (int u = 0; u < T::kN * 8 / kWgThreads; ++u) {
    const int idx = u * kWgThreads + int(threadIdx.x), t = idx / 8, c = idx % 8;
    const uint4 raw = *reinterpret_cast<const uint4*>(stage + t * kIndexHeadDim + c * 16);
    const uint2 f0 = e4m3x4_to_f16x4(raw.x), f1 = e4m3x4_to_f16x4(raw.y);
    const uint2 f2 = e4m3x4_to_f16x4(raw.z), f3 = e4m3x4_to_f16x4(raw.w);
    uint8_t* block = wide + (c / 4) * T::kKBlockBytes;
    const int even = 2 * (c % 4);
    const uint4 lo = make_uint4(f0.x, f0.y, f1.x, f1.y), hi = make_uint4(f2.x, f2.y, f3.x, f3.y);
    const int odd_first = c / 4;  // selects, not a branch: the warp stays converged
    *reinterpret_cast<uint4*>(block + swizzle128_offset(t, even + odd_first)) = odd_first ? hi : lo;
    *reinterpret_cast<uint4*>(block + swizzle128_offset(t, even + 1 - odd_first)) =
        odd_first ? lo : hi;
  }
}

// One step of the reduce-scatter over a column's lanes: out[k] = the lane's kept half + the
// partner's (lane xor `offset`) sent half; `up`: keep the upper half.
template <int kCount>
__device__ __forceinline__ void scatter_step(const float (&in)[kCount], float (&out)[kCount / 2],
                                             bool up, int offset) {
#pragma unroll
  for (int k = 0; k < kCount / 2; ++k) {
    const float send = up ? in[k] : in[k + kCount / 2], keep = up ? in[k + kCount / 2] : in[k];
    out[k] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, offset));
  }
}

template <KvDtype D, int kPages>
__global__ void __launch_bounds__(kWgThreads, (WgTile<D, kPages>::kBlocksPerSm))
    indexer_logits_wgmma(IndexerLogitsParams p, BlockPlan plan) {
  pdl_enter();
  using T = WgTile<D, kPages>;
  constexpr int kN = T::kN, kStages = T::kStages;
  const int row = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  RingBlock<T> b;
  QueryLoad<kWgWarps> q;  // loaded in start(): in flight while the first keys are queued
  if (!b.start(p, plan, smem_raw, q)) return;
  float* sums = reinterpret_cast<float*>(b.smem + T::kSumsOff);  // [warp][column]

  // The query into A while the first tiles arrive.
  store_query<D>(q, b.smem + T::kQueryOff, b.weight);

  const int g = lane / 4, qd = lane % 4;
  float* logits = p.logits + int64_t(row) * p.ld_logits;
  constexpr int kV = kN / 4;  // a lane's column values: 2 per 8-column block
  for (int i = 0; i < b.tiles; ++i) {
    cp_async_wait<kStages - 2>();                 // tile i has landed (this thread's copies)
    if constexpr (!T::kFp8) fence_proxy_async();  // ... visible to wgmma, which reads the stage
    __syncthreads();  // every thread's; tile i - 1's wgmma and epilogue are done
    const int64_t t0 = b.tile_t0(i);
    b.issue(p, i + kStages - 1);
    const uint8_t* stage = b.stage(i);
    uint32_t b_tile;
    if constexpr (T::kFp8) {
      widen_tile<T>(stage, b.smem + T::kWideOff);
      fence_proxy_async();
      __syncthreads();  // the f16 tile is complete
      b_tile = b.base + T::kWideOff;
    } else {
      b_tile = b.base + uint32_t(b.stage_offset(i));
    }

    float acc[kN / 2];
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) {
      acc[j] = 0.0f;
      fence_operand(acc[j]);
    }
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t desc_a =
            wgmma_desc_sw128(b.base + T::kQueryOff + kb * kQueryKBlockBytes + 32 * kk);
        const uint64_t desc_b = wgmma_desc_sw128(b_tile + kb * T::kKBlockBytes + 32 * kk);
        wgmma_tile<D, kN>(acc, desc_a, desc_b);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) fence_operand(acc[j]);

    // 2. This thread's heads 16 warp + g (+ 8) of columns 8 blk + 2 qd + e: v[2 blk + e].
    const float w_lo = b.weight[16 * warp + g], w_hi = b.weight[16 * warp + g + 8];
    float v[kV];
#pragma unroll
    for (int blk = 0; blk < kN / 8; ++blk) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        v[2 * blk + e] = __fmaf_rn(w_lo, fmaxf(acc[4 * blk + e], 0.0f),
                                   __fmul_rn(w_hi, fmaxf(acc[4 * blk + 2 + e], 0.0f)));
      }
    }
    // 3. Reduce-scatter over g: at the step of lane bit b (xor 4, 8, 16), the lane with bit b set
    // keeps the upper half of its values and sends the lower. Lane g ends with the values
    // m = k + (g & 1) kV / 2 + ((g >> 1) & 1) kV / 4 + ((g >> 2) & 1) kV / 8, k < kV / 8.
    float v2[kV / 2], v4[kV / 4], v8[kV / 8];
    scatter_step<kV>(v, v2, g & 1, 4);
    scatter_step<kV / 2>(v2, v4, (g >> 1) & 1, 8);
    scatter_step<kV / 4>(v4, v8, (g >> 2) & 1, 16);
    const int m0 = (g & 1) * (kV / 2) + ((g >> 1) & 1) * (kV / 4) + ((g >> 2) & 1) * (kV / 8);
#pragma unroll
    for (int k = 0; k < kV / 8; ++k) {
      const int m = m0 + k;
      sums[warp * kN + 8 * (m / 2) + 2 * qd + (m & 1)] = v8[k];
    }
    __syncthreads();  // every warp's column sums
    // 4. The warps, then k_scale; a page outside the pool gives 0 and one error.
    for (int col = tid; col < kN; col += kWgThreads) {
      const int64_t t = t0 + col;
      if (t >= b.end) break;
      float s = __fadd_rn(__fadd_rn(sums[col], sums[kN + col]),
                          __fadd_rn(sums[2 * kN + col], sums[3 * kN + col]));
      if (!valid_page(p, b.tile_pages(i)[col / kPageSize])) {
        s = 0.0f;
        if (col % kPageSize == 0 && p.error_count) atomicAdd(p.error_count, 1);
      } else if constexpr (T::kFp8) {
        s *= reinterpret_cast<const float*>(stage + T::kRawKeyBytes)[col];
      }
      logits[t] = s;
    }
  }
  cp_async_wait<0>();  // nothing in flight past here (the trailing groups are empty)
}

template <KvDtype D, int kPages>
cudaError_t launch_tile(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return launch_blocks(&indexer_logits_wgmma<D, kPages>, WgTile<D, kPages>::kSmemBytes, opted, p,
                       block_tokens, stream);
}

}  // namespace

cudaError_t launch_wgmma(const IndexerLogitsParams& p, int block_tokens, WgmmaSchedule schedule,
                         cudaStream_t stream) {
  if (p.pool.dtype == KvDtype::kBf16)
    return launch_tile<KvDtype::kBf16, 1>(p, block_tokens, stream);
  switch (schedule) {
    case WgmmaSchedule::kNarrow:
      return launch_tile<KvDtype::kFp8, 1>(p, block_tokens, stream);
    case WgmmaSchedule::kPipe:
      return launch_wgmma_pipe(p, block_tokens, stream);
    case WgmmaSchedule::kE4m3:
      return launch_wgmma_e4m3(p, block_tokens, stream);
    case WgmmaSchedule::kWide:
      break;
  }
  return launch_tile<KvDtype::kFp8, 2>(p, block_tokens, stream);
}

}  // namespace dsa::cuda::indexer_detail
