// The indexer's logits over a paged index-K cache (DESIGN §1.5) on tensor cores.
//
// Both variants share the arithmetic, so they give the same bits (the tests check it): S[h, t] =
// q[h] . k[t] on the m16n8k16 mma for 16 heads x 8 tokens, k steps ascending from zero; then per
// lane, m-tiles ascending, sum += w_lo * relu(S_lo) + w_hi * relu(S_hi) (one fma, one mul, one
// add); then over the 8 lanes of a column in a fixed tree (lanes xor 4, then 8, then 16); times
// k_scale for fp8. fp8 runs on the f16 mma: sm_90 has no e4m3 mma.sync, and every e4m3 value is
// exact in f16 (the packed cvt widens 2 at a time), so the dot products take the CPU's exact
// q8 * k8 products, summed in f32. A row's logits never depend on other rows, the chunking or the
// variant: the grid is fixed by the host sizes and the work per block only by that row's seq_len.
//
// The k (dim) order inside an mma is a free permutation as long as A and B agree, so each lane
// owns the bytes [u*64 + c*16, +16) of a token row (c = lane % 4, u = one 16-byte piece), which
// makes every copy cover contiguous 64-byte runs. word_byte() is that permutation. Tokens come in
// groups of 32 (4 n-tiles of 8), always inside one page.
//
// Variant "resident": blocks of 4 warps, two blocks per SM (237-255 registers, 84
// KiB fp8 / 96 KiB bf16 of shared memory). Each warp keeps the whole query as mma A fragments in
// registers (64 heads x 128 dims as f16 or bf16: 128 registers per lane) and streams its groups
// through a private cp.async ring in shared memory, kStages deep (fp8 5: four groups, 16.5 KiB,
// in flight per warp while it computes one, 132 KiB per SM; bf16 3). A block first reads its page
// ids and queues its first groups' keys, then loads, quantizes and lays out the query while they
// arrive (the query's bytes are the ring's last stage until the warps hold it). Per 32-token
// group a warp does 128 mma, 64 packed cvt (fp8), 8 16-byte shared loads of keys and 7 shuffles
// (a reduce-scatter of the 8 column sums). Short blocks (a long row over the whole GPU) run in
// clusters of 4 that share the query's preparation: each block quantizes 16 heads (e4m3 by the
// conversion unit) into all four blocks' shared memory. No key or scale at or past seq_len is
// read: the last group's copies of those tokens are zero-filled (cp.async with a source size of
// 0), where the legacy variant reads the whole 32-token group inside the row's last page.
//   Napkin, H200 (132 SMs, ~1.9 GHz, 4.25 TB/s copy): a token is 132 B (fp8) and 16384 flop.
//   mma.sync f16 sustains ~2100-2600 flop/clk/SM (half to two thirds of the wgmma peak), 6-8
//   clk/token/SM; HBM gives 32 B/ns/SM, 4.1 ns/token = 7.9 clk; the 64 cvt/token go to the
//   conversion pipe (<= 4 clk/token at 16/clk/SM); the head sum is ~1.3 clk/token of fp32 work.
//   These overlap: fp8 B=64 L=32K (2.1M tokens, 16K per SM) is ~65 us of bytes and 50-62 us of
//   mma, so ~75-90 us if they overlap well (target <= 95); B=1 L=128K (1000 tokens per SM: all
//   of a block's 4 groups per warp are in flight before its query is ready) is ~4 us of bytes
//   or mma after ~1.5-2 us of seq_len, page-id and query latency, so ~6 us.
//   Shared-memory traffic is 256 B/token (the ring, written once and read once); the former
//   kernel also reread the query's A fragments from shared memory every group (512 B/token),
//   which with the mma made it co-limited at ~15 clk/token (124 us).

// Variant "legacy": the former kernel, 8 warps per block, the query's A fragments in shared memory
// and reread each group; fp8 keys through a 2-stage per-warp cp.async ring, bf16 keys loaded
// straight into registers.
//
// Variant "wgmma" (indexer_wgmma.cu, its header has the design and the napkin math): all 64 heads
// against a tile of 64 (bf16) or 128 (fp8, widened to f16 in shared memory) tokens per Hopper
// warpgroup MMA, one warpgroup per block, two blocks per SM; "wgmma-n64" the same with fp8
// tiles of 64 tokens and three blocks per SM (bf16: the same kernel as "wgmma"). Not bitwise
// equal to the two mma.sync variants (another head-sum order), each batch-invariant on its own;
// the two tile widths give the same bits (the arithmetic of a token does not depend on N).
//
// "wgmma-pipe" computes the fp8 tile the other way round, S^T = K . Q^T, with the keys widened
// from the raw stage straight into wgmma's A registers while the previous tile's wgmma run and the
// head sum in registers; the same bits as "wgmma" (bf16: the same kernel as "wgmma").
// "wgmma-e4m3" (fp8 only) multiplies the e4m3 bytes as they land, on the fp8 tensor core, whose
// narrower accumulator gives its own bits, held to their own bound (indexer_wgmma_e4m3.cu).
//
// DSA_CUDA_INDEXER_VARIANT (legacy | resident | wgmma | wgmma-n64 | wgmma-pipe | wgmma-e4m3)
// forces a variant;
// DSA_CUDA_INDEXER_BLOCK_TOKENS (a power of two in [512, 8192]) the tokens per block, else the
// largest that still gives two blocks per SM over the batch: few long blocks amortize the per-block
// query setup at large batches, many short ones spread a single long row over the GPU;
// DSA_CUDA_INDEXER_CLUSTER (1, 2 or 4) the resident variant's blocks per cluster;
// DSA_CUDA_INDEXER_RING (auto, 6, 9 or 17) the ring depth of "wgmma-e4m3" (indexer_wgmma_e4m3.cu).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/pdl.h"

namespace dsa::cuda {
namespace {

using namespace indexer_detail;

// ---- variant "legacy" --------------------------------------------------------------------------

constexpr int kLegacyWarps = 8;
constexpr int kLegacyThreads = kLegacyWarps * 32;
constexpr int kLegacyStages = 2;
constexpr int kLegacyStagedSmemBytes =
    kLegacyWarps * kLegacyStages * Stage<KvDtype::kFp8>::kBytes;  // dynamic, fp8 only

struct SharedQuery {
  uint4 frag[kMaxMTiles * 8 * 32];   // A fragments [m-tile][k-step][lane], 4 regs each
  uint8_t natural[kMaxHeads * 256];  // q per head as bf16 or e4m3 bytes, [head][256 bytes]
  float weight[kMaxHeads];           // w, or w * s_q for fp8; 0 for padded heads
};

// Builds the A fragments from s.natural with the lane permutation of the key loads.
template <KvDtype D>
__device__ void build_fragments(int m_tiles, SharedQuery& s) {
  const int total = m_tiles * kKSteps * 32;
  for (int i = threadIdx.x; i < total; i += kLegacyThreads) {
    const int lane = i % 32, ks = (i / 32) % kKSteps, mt = i / (32 * kKSteps);
    s.frag[i] = query_fragment<D>(s.natural, 256, mt, ks, lane);
  }
}

// One warp, the 32 tokens [t0, t0 + 32) of one page whose raw key pieces are in `keys` (B
// fragments of token off0 + n*8 + g): writes their logits where t < seq_len. scales: the fp8
// tokens' scales, indexed by column.
template <KvDtype D>
__device__ void group_logits(const SharedQuery& s, int m_tiles,
                             const uint4 (&keys)[kNTiles][KeyShape<D>::kLoads], const float* scales,
                             int64_t t0, int64_t seq_len, float* logits) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;

  uint2 b[kNTiles][kKSteps];  // fp8 keys are widened once here, not once per m-tile
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) key_fragments<D>(keys[n], b[n]);

  float sum[kNTiles][2] = {};  // columns n*8 + c*2 + {0,1}, partial over rows g, g+8
  for (int mt = 0; mt < m_tiles; ++mt) {
    float acc[kNTiles][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const uint4 a = s.frag[(mt * kKSteps + ks) * 32 + lane];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) mma<D>(acc[n], a, b[n][ks].x, b[n][ks].y);
    }
    const float w_lo = s.weight[mt * 16 + g], w_hi = s.weight[mt * 16 + g + 8];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sum[n][j] = add_heads(sum[n][j], w_lo, acc[n][j], w_hi, acc[n][2 + j]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float v = sum[n][j];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      sum[n][j] = v;
    }
  }
  if (g != 0) return;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = n * 8 + c * 2 + j;
      const int64_t t = t0 + col;
      if (t >= seq_len) continue;
      float v = sum[n][j];
      if constexpr (D == KvDtype::kFp8) v *= scales[col];
      logits[t] = v;
    }
  }
}

template <KvDtype D>
__global__ void __launch_bounds__(kLegacyThreads)
    indexer_logits_legacy(IndexerLogitsParams p, int block_tokens) {
  pdl_enter();
  constexpr int kLoads = KeyShape<D>::kLoads;
  constexpr bool kStaged = D == KvDtype::kFp8;
  constexpr int kStageBytes = Stage<KvDtype::kFp8>::kBytes;
  const int row = blockIdx.y;
  const int64_t seq_len = clamped_seq_len(p, row);
  const int64_t block_t0 = int64_t(blockIdx.x) * block_tokens;
  if (block_t0 >= seq_len) return;  // padded rows and tails cost one load
  const int64_t block_end = min(seq_len, block_t0 + block_tokens);

  __shared__ SharedQuery s;
  __shared__ int32_t block_pages[kMaxBlockTokens / kPageSize];  // the block's page ids
  extern __shared__ __align__(16) uint8_t staged[];             // fp8: [warp][stage][kStageBytes]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* pages = p.page_table + int64_t(row) * p.ld_page_table;
  static_assert(kMaxBlockTokens / kPageSize <= kLegacyThreads, "one page id per thread");
  if (threadIdx.x < block_tokens / kPageSize && block_t0 + threadIdx.x * kPageSize < block_end) {
    block_pages[threadIdx.x] = pages[block_t0 / kPageSize + threadIdx.x];
  }
  const int heads_padded = (p.heads + 15) / 16 * 16;
  const int m_tiles = heads_padded / 16;
  {
    QueryLoad<kLegacyWarps> q;
    load_query(p, row, q, [](int) { return true; });
    encode_query<D>(q, heads_padded, s.natural, 256, s.weight);
  }
  __syncthreads();  // block_pages and s.natural are complete

  // This warp's groups: t0 = block_t0 + warp * 32 + i * 256 while t0 < block_end.
  const int64_t warp_t0 = block_t0 + warp * kGroupTokens;
  constexpr int kStride = kLegacyWarps * kGroupTokens;
  auto page_of = [&](int64_t t0) { return block_pages[(t0 - block_t0) / kPageSize]; };
  uint8_t* my_stages = staged + warp * kLegacyStages * kStageBytes;
  auto issue = [&](int64_t t0, int i) {  // fp8: the copies of group i, or an empty group
    if (t0 < block_end && valid_page(p, page_of(t0))) {
      stage_group<D>(page_base_of<D>(p, page_of(t0)), int(t0 % kPageSize),
                     my_stages + (i % kLegacyStages) * kStageBytes);
    }
    cp_async_commit();
  };
  if constexpr (kStaged) issue(warp_t0, 0);  // in flight while the fragments are built

  build_fragments<D>(m_tiles, s);
  __syncthreads();

  float* logits = p.logits + int64_t(row) * p.ld_logits;
  int i = 0;
  for (int64_t t0 = warp_t0; t0 < block_end; t0 += kStride, ++i) {
    const int32_t page = page_of(t0);
    uint4 keys[kNTiles][kLoads];
    const float* scales = nullptr;
    if constexpr (kStaged) {
      issue(t0 + kStride, i + 1);
      cp_async_wait<1>();  // group i has landed (this lane's copies)
      __syncwarp();        // and every lane's: the scales cross lanes
      if (valid_page(p, page)) {
        const uint8_t* stage = my_stages + (i % kLegacyStages) * kStageBytes;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) staged_keys<D>(stage, n, keys[n]);
        scales = reinterpret_cast<const float*>(stage + Stage<D>::kKeyBytes);
      }
    } else if (valid_page(p, page)) {
      const uint8_t* base = page_base_of<D>(p, page);
      const int g = lane / 4, c = lane % 4, off0 = int(t0 % kPageSize);
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const uint8_t* key_row = base + int64_t(off0 + n * 8 + g) * KeyShape<D>::kRowBytes;
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          keys[n][u] = __ldg(reinterpret_cast<const uint4*>(key_row + u * 64 + c * 16));
        }
      }
    }
    if (valid_page(p, page)) {
      group_logits<D>(s, m_tiles, keys, scales, t0, seq_len, logits);
    } else {
      bad_page_group(p, t0, seq_len, logits);
    }
    if constexpr (kStaged) __syncwarp();  // every lane is done with stage i before it is reused
  }
}

// ---- dispatch ----------------------------------------------------------------------------------

enum class Variant { kLegacy, kResident, kWgmma, kWgmmaN64, kWgmmaPipe, kWgmmaE4m3 };

// The variant used when none is forced, per cache dtype: one line each to flip.
constexpr Variant kDefaultBf16 = Variant::kWgmma;
constexpr Variant kDefaultFp8 = Variant::kWgmmaE4m3;

// The forced variant, or the default of the dtype (the H200 measurements below).
Variant variant_for(KvDtype dtype) {
  if (const char* v = std::getenv("DSA_CUDA_INDEXER_VARIANT")) {
    if (std::strcmp(v, "legacy") == 0) return Variant::kLegacy;
    if (std::strcmp(v, "resident") == 0) return Variant::kResident;
    if (std::strcmp(v, "wgmma") == 0) return Variant::kWgmma;
    if (std::strcmp(v, "wgmma-n64") == 0) return Variant::kWgmmaN64;
    if (std::strcmp(v, "wgmma-pipe") == 0) return Variant::kWgmmaPipe;
    if (std::strcmp(v, "wgmma-e4m3") == 0) return Variant::kWgmmaE4m3;
  }
  // H200, 2026-12-03 (bench/results/2026-12-03-h200-check.md), us, legacy / wgmma / wgmma-pipe:
  //   bf16: B = 1, L = 128K 16.7 / 13.6 / 13.8; B = 64, L = 32K 146.2 / 139.4 / 139.6;
  //         B = 256 548.4 / 530.8 / 533.6.
  //   fp8:  B = 1, L = 128K 18.4 / 17.1 / 14.7; B = 64, L = 32K 124.6 / 143.4 / 107.4;
  //         B = 256 451.0 / 530.8 / 364.5.
  // So wgmma for bf16 caches and its overlapped schedule (same bits as wgmma) for fp8 ones (the
  // resident variant was slower than legacy: bench/results/2026-12-03-h200-attn-mla.md).
  // H200, 2026-12-04 (bench/results/2026-12-04-h200-indexer-e4m3.md), fp8, us, wgmma-pipe /
  // wgmma-e4m3 (its bits within kLogitsE4m3Nmse of the CPU's): B = 1, L = 128K 14.6 / 13.1;
  // B = 64, L = 32K 106.5 / 89.2 (2048-token blocks); B = 256 360.0 / 311.6. So fp8 caches run
  // wgmma-e4m3 now. The dtype is the cache's, fixed for the process, so a row's bits never
  // depend on the batch.
  return dtype == KvDtype::kBf16 ? kDefaultBf16 : kDefaultFp8;
}

// Tokens per block: the override, or the largest size that keeps two blocks per SM (every
// variant holds two blocks per SM; six for "wgmma-e4m3" on fp8, below). The wgmma variants take
// blocks of whole tiles down to kMinWgmmaBlockTokens; the legacy and resident ones down to
// kMinBlockTokens (their 8 warps of kGroupTokens). The block size never enters a logit's arithmetic
// (each token's chain and head sum are the same in any block), so it is free per call.
constexpr int kMinWgmmaBlockTokens = 128;
int block_tokens_for(const IndexerLogitsParams& p, Variant variant) {
  const bool wgmma = variant == Variant::kWgmma || variant == Variant::kWgmmaN64 ||
                     variant == Variant::kWgmmaPipe || variant == Variant::kWgmmaE4m3;
  const int floor = wgmma ? kMinWgmmaBlockTokens : kMinBlockTokens;
  if (const char* v = std::getenv("DSA_CUDA_INDEXER_BLOCK_TOKENS")) {
    const int forced = std::atoi(v);
    if (forced >= floor && forced <= kMaxBlockTokens && (forced & (forced - 1)) == 0) {
      return forced;
    }
  }
  // "wgmma-e4m3" on an fp8 cache streams a tile in about a third of the others' SM time, so its
  // blocks' last wave weighs more: it wants about six blocks per SM (H200, B = 64, L = 32K: 89 us
  // with 2048 tokens per block, 102 with 4096 and 106 with 1024;
  // bench/results/2026-12-04-h200-indexer-e4m3.md).
  const int per_sm = variant == Variant::kWgmmaE4m3 && p.pool.dtype == KvDtype::kFp8 ? 6 : 2;
  const int sms = device_sm_count();
  auto blocks = [&](int tokens) { return int64_t(p.rows) * ((p.ld_logits + tokens - 1) / tokens); };
  int tokens = kMaxBlockTokens;
  while (tokens > kMinBlockTokens && blocks(tokens) < per_sm * int64_t(sms)) tokens /= 2;
  // Short rows at small batches: below 512 tokens a block's opening weighs more than its tiles
  // (B = 1, L = 128K: 14.3 us at 512, 22.0 at 256, bench/results/2026-12-06-h100-hn2.md), but a
  // launch of fewer blocks than SMs (B = 1, L = 4K: 9 blocks of eight tiles each, one after the
  // other) leaves most of the GPU idle while each block walks its tiles. The wgmma variants go on
  // halving, down to kMinWgmmaBlockTokens, while the blocks still fit on the SMs one each.
  while (wgmma && tokens > kMinWgmmaBlockTokens && blocks(tokens / 2) <= int64_t(sms)) tokens /= 2;
  return tokens;
}

template <KvDtype D>
cudaError_t launch(const IndexerLogitsParams& p, Variant variant, cudaStream_t stream) {
  const int block_tokens = block_tokens_for(p, variant);
  if (variant == Variant::kResident) return launch_resident(p, block_tokens, stream);
  if (variant == Variant::kWgmma) {
    return launch_wgmma(p, block_tokens, WgmmaSchedule::kWide, stream);
  }
  if (variant == Variant::kWgmmaN64) {
    return launch_wgmma(p, block_tokens, WgmmaSchedule::kNarrow, stream);
  }
  if (variant == Variant::kWgmmaPipe) {
    return launch_wgmma(p, block_tokens, WgmmaSchedule::kPipe, stream);
  }
  if (variant == Variant::kWgmmaE4m3) {
    return launch_wgmma(p, block_tokens, WgmmaSchedule::kE4m3, stream);
  }
  const dim3 grid(unsigned((p.ld_logits + block_tokens - 1) / block_tokens), unsigned(p.rows));
  if constexpr (D == KvDtype::kFp8) {
    static std::atomic<uint64_t> opted{0};
    const cudaError_t e = opt_in_smem(reinterpret_cast<const void*>(&indexer_logits_legacy<D>),
                                      kLegacyStagedSmemBytes, false, opted);
    if (e != cudaSuccess) return e;
    launch_kernel(indexer_logits_legacy<D>, grid, kLegacyThreads, kLegacyStagedSmemBytes, stream, p,
                  block_tokens);
  } else {
    launch_kernel(indexer_logits_legacy<D>, grid, kLegacyThreads, 0, stream, p, block_tokens);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.heads > kMaxHeads || p.rows > 65535 || p.ld_logits <= 0) {
    return cudaErrorInvalidValue;
  }
  const Variant variant = variant_for(p.pool.dtype);
  return p.pool.dtype == KvDtype::kBf16 ? launch<KvDtype::kBf16>(p, variant, stream)
                                        : launch<KvDtype::kFp8>(p, variant, stream);
}

}  // namespace dsa::cuda
