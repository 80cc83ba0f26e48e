// What the wgmma indexer-logits kernels share (indexer_wgmma.cu: "wgmma" and "wgmma-n64";
// indexer_wgmma_pipe.cu: "wgmma-pipe"; indexer_wgmma_e4m3.cu: "wgmma-e4m3"): one warpgroup per
// CTA, the copies of a tile of tokens into a ring stage, the block's span, page ids and opening
// (RingBlock), the query in the swizzled layout, the S^T epilogue, and the launch over the
// blocks of every row.
#pragma once

#include <atomic>

#include "backend/cuda/env_knobs.h"
#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda::indexer_detail {
constexpr int kWgThreads = 128;  // one warpgroup
constexpr int kWgWarps = kWgThreads / 32;
constexpr int kQueryKBlockBytes = kMaxHeads * kSwizzleRowBytes;  // 64 heads x 64 dims, 8 KiB

// Queues the copies of the tile of tokens [t0, t0 + kN) of its row into `stage`, one commit group
// either way (empty past `end`); tile_pages: the tile's kPages page ids. Tokens at or past `end`
// and pages outside the pool are zero-filled, never read. kSwizzledRaw (fp8): chunk c of row r at
// 16-byte position c ^ (r % 8).
template <class T, bool kSwizzledRaw = false>
__device__ __forceinline__ void issue_tile(const IndexerLogitsParams& p, const int32_t* tile_pages,
                                           int64_t end, int64_t t0, uint8_t* stage) {
  constexpr KvDtype D = T::kFp8 ? KvDtype::kFp8 : KvDtype::kBf16;
  const int tid = threadIdx.x;
  if (t0 >= end) {  // past the block: an empty group
    cp_async_commit();
    return;
  }
#pragma unroll
  for (int kp = 0; kp < T::kPages; ++kp) {
    const int64_t page_t0 = t0 + kp * kPageSize;
    int valid = 0;
    const uint8_t* base = p.pool.data;  // the source of zero-byte copies
    if (page_t0 < end) {
      const int32_t page = tile_pages[kp];
      if (valid_page(p, page)) {
        valid = int(min(int64_t(kPageSize), end - page_t0));
        base = page_base_of<D>(p, page);
      }
    }
    if constexpr (T::kFp8) {
      // Keys: 64 rows of 128 bytes, 4 chunks of 16 per thread; row kp * 64 + token of the stage.
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int idx = u * kWgThreads + tid, token = idx / 8, c = idx % 8;
        const int bytes = token < valid ? 16 : 0;
        const uint8_t* src = bytes ? base + token * kIndexHeadDim + c * 16 : base;
        const int r = kp * kPageSize + token;
        const int pos = kSwizzledRaw ? c ^ (r & 7) : c;
        cp_async16_zfill(stage + r * kIndexHeadDim + pos * 16, src, bytes);
      }
      // Scales: 16 chunks of 4 tokens per page.
      if (tid / 16 == kp) {
        const int k = tid % 16;
        const int bytes = 4 * max(0, min(4, valid - 4 * k));
        const uint8_t* src = bytes ? base + kPageSize * kIndexHeadDim + k * 16 : base;
        cp_async16_zfill(stage + T::kRawKeyBytes + (kp * kPageSize + 4 * k) * 4, src, bytes);
      }
    } else {
      // Keys: 64 rows of 256 bytes into the two swizzled K blocks, 8 chunks of 16 per thread.
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int idx = u * kWgThreads + tid, token = idx / 16, c16 = idx % 16;
        const int bytes = token < valid ? 16 : 0;
        const uint8_t* src = bytes ? base + token * 256 + c16 * 16 : base;
        const int row = kp * kPageSize + token;
        cp_async16_zfill(stage + (c16 / 8) * T::kKBlockBytes + swizzle128_offset(row, c16 % 8), src,
                         bytes);
      }
    }
  }
  cp_async_commit();
}

// How a row's blocks share its tiles (the kernels' second parameter; launch_blocks fills it):
// `tokens` per block (the grid's x is ceil(ld_logits / tokens)); `interleaved`: block x of the G
// blocks of a row takes the row's tiles x, x + G, x + 2 G, ... (DSA_CUDA_INDEXER_TILES=interleaved;
// the default stays contiguous until it has run on a GPU),
// so that a row shorter than its capacity (ld_logits is the cache's, seq_len the row's) still
// spreads over every block; else block x takes the tiles of tokens [x tokens, (x + 1) tokens).
// Each tile's instructions are the same either way, so are its logits.
struct BlockPlan {
  int tokens;
  int interleaved;
};

// The block's tiles of its row: tile i's tokens [t0 + i stride, + kN), those before `end` (the
// row's clamped seq_len, or the block's end when contiguous); `tiles` of them (0: nothing to do),
// and this thread's page id among the block's, tile-major (tile tid / kPages, page tid % kPages;
// -1 past them). The page ids are loaded beside seq_len (one round trip before the first copy,
// not two): entries of the row's table, whose pages past seq_len are never dereferenced.
struct BlockSpan {
  int64_t t0, stride, end;
  int tiles;
  int32_t page_id;
};
template <int kN>
__device__ __forceinline__ BlockSpan block_span(const IndexerLogitsParams& p, BlockPlan plan) {
  static_assert(kMaxBlockTokens / kPageSize <= kWgThreads, "one page id per thread");
  constexpr int kPages = kN / kPageSize;
  const int row = blockIdx.y, tid = threadIdx.x;
  const int64_t seq = clamped_seq_len(p, row);
  BlockSpan span{0, kN, 0, 0, -1};
  int64_t first_tile = 0, tile_step = 1;  // the block's tiles in the row's tile order
  if (plan.interleaved) {
    first_tile = blockIdx.x, tile_step = gridDim.x;
    span.end = seq;
    const int64_t row_tiles = (seq + kN - 1) / kN;
    span.tiles =
        first_tile < row_tiles ? int((row_tiles - first_tile + tile_step - 1) / tile_step) : 0;
  } else {
    first_tile = int64_t(blockIdx.x) * (plan.tokens / kN);
    span.end = min(seq, (first_tile + plan.tokens / kN) * kN);
    span.tiles = span.end > first_tile * kN ? int((span.end - first_tile * kN + kN - 1) / kN) : 0;
  }
  span.t0 = first_tile * kN, span.stride = tile_step * kN;
  const int32_t* pages = p.page_table + int64_t(row) * p.ld_page_table;
  const int64_t page_index = (first_tile + (tid / kPages) * tile_step) * kPages + tid % kPages;
  if (tid < plan.tokens / kPageSize && page_index < p.ld_page_table) {
    span.page_id = pages[page_index];
  }
  return span;
}

// The first 1024-aligned byte of dynamic shared memory (the swizzle atoms need that alignment;
// dynamic shared memory promises 16), and its shared address in `addr`.
__device__ __forceinline__ uint8_t* atom_aligned(uint8_t* smem_raw, uint32_t& addr) {
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad =
      (kSwizzleAtomBytes - (raw_addr & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1);
  addr = raw_addr + pad;
  return smem_raw + pad;
}

// A block of the wgmma kernels over its ring of T::kStages stages (T: the kernel's tile, with its
// kN, kStages, kRingOff, kStageBytes, kWeightOff and kPagesOff). start() is the block's opening,
// the same in every such kernel: its span of the row, its 1024-aligned shared memory, the row's
// query loaded into `q` (in flight while the first tiles are queued), the page ids published, and
// the copies of tiles 0 .. kStages - 2 queued, one commit group each (kSwizzledRaw: fp8 rows in
// the swizzled raw layout, issue_tile). It returns false, before any barrier, for a block past
// seq_len (padded rows and tails cost two loads); the caller returns. load_q false: `q` is left
// alone (the caller stores the encoding indexer_query gave, store_given_query).
template <class T, bool kSwizzledRaw = false>
struct RingBlock {
  int64_t t0 = 0, stride = 0, end = 0;  // tile i: tokens [t0 + i stride, + kN) before end
  int tiles = 0;
  uint32_t base = 0;         // the shared address of smem
  uint8_t* smem = nullptr;   // 1024-aligned
  float* weight = nullptr;   // [kMaxHeads] the heads' weights (store_query writes them)
  int32_t* pages = nullptr;  // the block's page ids, tile-major

  __device__ __forceinline__ int stage_offset(int i) const {
    return T::kRingOff + (i % T::kStages) * T::kStageBytes;
  }
  __device__ __forceinline__ uint8_t* stage(int i) const { return smem + stage_offset(i); }
  // The first token of tile i and its page ids.
  __device__ __forceinline__ int64_t tile_t0(int i) const { return t0 + int64_t(i) * stride; }
  __device__ __forceinline__ const int32_t* tile_pages(int i) const {
    return pages + i * T::kPages;
  }
  // Queues the copies of tile i of the block into its stage: one commit group (empty past the
  // block's tiles).
  __device__ __forceinline__ void issue(const IndexerLogitsParams& p, int i) const {
    if (i >= tiles) {
      cp_async_commit();
      return;
    }
    issue_tile<T, kSwizzledRaw>(p, tile_pages(i), end, tile_t0(i), stage(i));
  }

  __device__ __forceinline__ bool start(const IndexerLogitsParams& p, BlockPlan plan,
                                        uint8_t* smem_raw, QueryLoad<kWgWarps>& q,
                                        bool load_q = true) {
    const BlockSpan span = block_span<T::kN>(p, plan);
    if (span.tiles == 0) return false;
    t0 = span.t0, stride = span.stride, end = span.end, tiles = span.tiles;
    smem = atom_aligned(smem_raw, base);
    weight = reinterpret_cast<float*>(smem + T::kWeightOff);
    pages = reinterpret_cast<int32_t*>(smem + T::kPagesOff);
    if (load_q) load_query(p, int(blockIdx.y), q, [](int) { return true; });
    pages[threadIdx.x] = span.page_id;
    __syncthreads();  // pages is complete
#pragma unroll
    for (int i = 0; i < T::kStages - 1; ++i) issue(p, i);
    return true;
  }
};

// The loaded query into the two 128-byte-swizzled K blocks at `query` (rows = heads, K-major; bf16,
// or f16 holding the e4m3 values for fp8) and the weights: lane holds dims [4 lane, 4 lane + 4)
// of head warp + 4 i, i.e. K block lane / 16, f16 chunk (lane % 16) / 2, bytes (lane % 2) * 8 of
// it. Ends with the proxy fence: the stores are visible to wgmma after the next barrier.
// kE4m3Bytes (fp8 only): the e4m3 bytes themselves instead, one swizzled K block of 128 dims
// (row h = head h, 128 bytes; lane's 4 bytes in chunk lane / 4), the B operand of the e4m3 wgmma.
template <KvDtype D, bool kE4m3Bytes = false>
__device__ __forceinline__ void store_query(const QueryLoad<kWgWarps>& q, uint8_t* query,
                                            float* weight) {
  static_assert(!kE4m3Bytes || D == KvDtype::kFp8, "e4m3 bytes are an fp8 query");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < QueryLoad<kWgWarps>::kHeadsPerWarp; ++i) {
    const int h = warp + i * kWgWarps;
    uint2 e;
    const float w = encode_head<D, true>(q.x[i], q.w[i], e);
    if constexpr (kE4m3Bytes) {
      *reinterpret_cast<uint32_t*>(query + swizzle128_offset(h, lane / 4) + (lane % 4) * 4) = e.x;
    } else {
      if constexpr (D == KvDtype::kFp8) {
        e = e4m3x4_to_f16x4(e.x);
      }
      uint8_t* dst = query + (lane / 16) * kQueryKBlockBytes +
                     swizzle128_offset(h, (lane % 16) / 2) + (lane % 2) * 8;
      *reinterpret_cast<uint2*>(dst) = e;
    }
    if (lane == 0) weight[h] = w;
  }
  fence_proxy_async();
}

// store_query<kFp8, true>'s bytes and weights from the encoding indexer_query wrote (p.q_fp8,
// p.q_fp8_scale: the same encoder, so the same bytes): lane's 4 bytes of head h = warp + 4 i in
// chunk lane / 4 of the swizzled K block, and the weight (w_scale w) * s_q, 0 past p.heads, as
// encode_head computes it. The launcher has checked the 4-byte alignment.
__device__ __forceinline__ void store_given_query(const IndexerLogitsParams& p, int row,
                                                  uint8_t* query, float* weight) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* q8 = p.q_fp8 + int64_t(row) * p.ld_q_fp8;
  uint32_t bytes[QueryLoad<kWgWarps>::kHeadsPerWarp];
  float w[QueryLoad<kWgWarps>::kHeadsPerWarp];
#pragma unroll
  for (int i = 0; i < QueryLoad<kWgWarps>::kHeadsPerWarp; ++i) {  // every load before any use
    const int h = warp + i * kWgWarps;
    const bool real = h < p.heads;
    bytes[i] = real ? *reinterpret_cast<const uint32_t*>(q8 + h * kIndexHeadDim + lane * 4) : 0u;
    w[i] = real && lane == 0 ? __fmul_rn(p.w_scale, p.w[int64_t(row) * p.ld_w + h]) *
                                   p.q_fp8_scale[int64_t(row) * p.heads + h]
                             : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < QueryLoad<kWgWarps>::kHeadsPerWarp; ++i) {
    const int h = warp + i * kWgWarps;
    *reinterpret_cast<uint32_t*>(query + swizzle128_offset(h, lane / 4) + (lane % 4) * 4) =
        bytes[i];
    if (lane == 0) weight[h] = w[i];
  }
  fence_proxy_async();
}

// This thread's head weights in an S^T tile's epilogue: heads 16 hw + 2 qd + e (lo) and + 8 (hi)
// of head group hw (qd = lane % 4), read from the published weights.
struct StWeights {
  float lo[4][2], hi[4][2];
  __device__ __forceinline__ explicit StWeights(const float* weight) {
    const int qd = threadIdx.x % 4;
#pragma unroll
    for (int hw = 0; hw < 4; ++hw) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        lo[hw][e] = weight[16 * hw + 2 * qd + e];
        hi[hw][e] = weight[16 * hw + 2 * qd + e + 8];
      }
    }
  }
};

// The epilogue of an S^T tile ([64 tokens x 64 heads], "wgmma-pipe" and "wgmma-e4m3"): the tile of
// tokens [t0, t0 + 64) of the row (its page `page`; tokens at or past `end` are not written) from
// relu[4 j + 2 tk + e] = max(S[head 8 j + 2 qd + e]
// [token 16 warp + g + 8 tk], 0) (g = lane / 4, qd = lane % 4) and the tokens' scales
// (scale[tk]): the weighted head sum of each token into its logit.
//   1. Head group hw's pair (16 hw + g', 16 hw + g' + 8) for g' = 2 qd + e is blocks j = 2 hw and
//      2 hw + 1: x(g') = w_lo relu(j = 2 hw) + w_hi relu(j = 2 hw + 1), and
//      y[tk][hw] = x(g' = 2 qd) + x(g' = 2 qd + 1).
//   2. Over qd: xor 1 keeps row r + 8 tk, tk = qd & 1 (a reduce-scatter over the two rows),
//      giving (g'0 + g'1) + (g'2 + g'3) or (g'4 + g'5) + (g'6 + g'7); xor 2 adds the two halves.
//   3. The head groups (W0 + W1) + (W2 + W3), in registers; times the token's scale. A page
//      outside the pool gives 0 and one error.
__device__ __forceinline__ void st_epilogue(const IndexerLogitsParams& p, float* logits,
                                            int32_t page, int64_t t0, int64_t end,
                                            const float (&relu)[32], const float (&scale)[2],
                                            const StWeights& w) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, qd = lane % 4;
  float y[2][4];
#pragma unroll
  for (int tk = 0; tk < 2; ++tk) {
#pragma unroll
    for (int hw = 0; hw < 4; ++hw) {
      float x[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        x[e] = __fmaf_rn(w.lo[hw][e], relu[4 * (2 * hw) + 2 * tk + e],
                         __fmul_rn(w.hi[hw][e], relu[4 * (2 * hw + 1) + 2 * tk + e]));
      }
      y[tk][hw] = __fadd_rn(x[0], x[1]);
    }
  }
  const int tk = qd & 1;
  float sum[4];
#pragma unroll
  for (int hw = 0; hw < 4; ++hw) {
    const float keep = tk ? y[1][hw] : y[0][hw], send = tk ? y[0][hw] : y[1][hw];
    const float z = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 1));
    sum[hw] = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, 2));
  }
  float s = __fadd_rn(__fadd_rn(sum[0], sum[1]), __fadd_rn(sum[2], sum[3]));
  if (!valid_page(p, page)) {
    s = 0.0f;
    if (tid == 0 && p.error_count) atomicAdd(p.error_count, 1);
  } else {
    s *= tk ? scale[1] : scale[0];
  }
  const int64_t t = t0 + 16 * warp + g + 8 * tk;
  if (qd < 2 && t < end) logits[t] = s;
}

// Opts `kernel` in to its dynamic shared memory past 48 KiB and to the largest carveout (so that
// its blocks per SM fit), once per device, then launches it over the blocks of every row.
template <class Kernel>
cudaError_t launch_blocks(Kernel kernel, int smem_bytes, std::atomic<uint64_t>& opted,
                          const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  const cudaError_t e = once_per_device(opted, false, [&] {
    const void* k = reinterpret_cast<const void*>(kernel);
    const cudaError_t err =
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return err;
    return cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                int(cudaSharedmemCarveoutMaxShared));
  });
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned((p.ld_logits + block_tokens - 1) / block_tokens), unsigned(p.rows));
  const BlockPlan plan{block_tokens, indexer_interleaves_tiles() ? 1 : 0};
  launch_kernel(kernel, grid, kWgThreads, smem_bytes, stream, p, plan);
  return cudaGetLastError();
}

// "wgmma-pipe" over every row's blocks (indexer_wgmma_pipe.cu).
cudaError_t launch_wgmma_pipe(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream);

// "wgmma-e4m3" over every row's blocks (indexer_wgmma_e4m3.cu).
cudaError_t launch_wgmma_e4m3(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream);

}  // namespace dsa::cuda::indexer_detail
