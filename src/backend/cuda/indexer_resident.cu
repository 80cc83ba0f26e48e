// The indexer logits kernel, variant "resident" (indexer_logits.cu's header: the design, the
// napkin math, and why it is not the default): 4-warp blocks, each warp holding the whole query as
// mma A fragments in registers and streaming its keys through its own cp.async ring; short
// blocks run in clusters of up to 4 that share the query's preparation. Same bits as "legacy".
#include <cooperative_groups.h>

#include <atomic>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/pdl.h"

namespace dsa::cuda::indexer_detail {
namespace {

namespace cg = cooperative_groups;

// ---- variant "resident" ------------------------------------------------------------------------

constexpr int kResWarps = 4;
constexpr int kResThreads = kResWarps * 32;
constexpr int kResStride = kResWarps * kGroupTokens;  // a warp's groups are this many tokens apart
constexpr int kResMaxGroups = kMaxBlockTokens / kResStride;  // per warp
static_assert(kResMaxGroups <= 64, "a warp's page ids fit in two registers per lane");
static_assert(kMinBlockTokens % kResStride == 0, "every warp has a whole number of groups");

// The ring is [stage][warp][Stage bytes]. The natural query and the weights live in the last
// stage's bytes: the prologue fills stages 0 .. kStages-2, and stage kStages-1 is first written
// after the query is in registers (and a barrier).
template <KvDtype D>
struct Resident {
  static constexpr int kStages = D == KvDtype::kFp8 ? 5 : 3;
  static constexpr int kStageRowBytes = kResWarps * Stage<D>::kBytes;  // one stage, every warp
  // Natural query bytes per head: a row and 64 bytes, so that the 8 lanes of a 16-byte shared
  // load phase (rows g, g + 1, columns c) hit 8 distinct 16-byte bank groups.
  static constexpr int kQueryStride = KeyShape<D>::kRowBytes + 64;
  static constexpr int kQueryBytes = kMaxHeads * kQueryStride + kMaxHeads * 4;
  static constexpr int kSmemBytes = kStages * kStageRowBytes;
  static_assert(kQueryBytes <= kStageRowBytes, "the query fits in the last stage");
};

// One warp, the staged group of 32 tokens [t0, t0 + 32) of one page: writes their logits where
// t < seq_len. a, w_lo, w_hi: the query's A fragments and the weights of heads mt*16 + g (+ 8).
template <KvDtype D, int kMT>
__device__ __forceinline__ void resident_group(const uint4 (&a)[kMT][kKSteps],
                                               const float (&w_lo)[kMT], const float (&w_hi)[kMT],
                                               const uint8_t* stage, int64_t t0, int64_t seq_len,
                                               float* logits) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  float v[2 * kNTiles];  // v[n*2 + j]: column n*8 + c*2 + j, partial over heads g, g+8 (+16k)
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    uint4 raw[KeyShape<D>::kLoads];
    staged_keys<D>(stage, n, raw);
    uint2 b[kKSteps];
    key_fragments<D>(raw, b);
    float acc[kMT][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) mma<D>(acc[mt], a[mt][ks], b[ks].x, b[ks].y);
    }
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      s0 = add_heads(s0, w_lo[mt], acc[mt][0], w_hi[mt], acc[mt][2]);
      s1 = add_heads(s1, w_lo[mt], acc[mt][1], w_hi[mt], acc[mt][3]);
    }
    v[n * 2] = s0;
    v[n * 2 + 1] = s1;
  }
  // Reduce-scatter of the 8 column sums over the 8 lanes g of a column: the pairs (xor 4, then 8,
  // then 16) of the legacy variant's all-reduce, so the same bits, in 7 shuffles instead of 24.
  // Lane g ends with value m = 4 (g & 1) + 2 ((g >> 1) & 1) + (g >> 2).
  const bool b0 = g & 1, b1 = (g >> 1) & 1, b2 = (g >> 2) & 1;
  float v4[4], v2[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float send = b0 ? v[k] : v[k + 4], keep = b0 ? v[k + 4] : v[k];
    v4[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float send = b1 ? v4[k] : v4[k + 2], keep = b1 ? v4[k + 2] : v4[k];
    v2[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  const float send = b2 ? v2[0] : v2[1], keep = b2 ? v2[1] : v2[0];
  float sum = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  const int m = 4 * int(b0) + 2 * int(b1) + int(b2);
  const int col = (m >> 1) * 8 + c * 2 + (m & 1);
  if constexpr (D == KvDtype::kFp8) {
    sum *= reinterpret_cast<const float*>(stage + Stage<D>::kKeyBytes)[col];
  }
  if (t0 + col < seq_len) logits[t0 + col] = sum;
}

// This lane's A fragments of the whole query, as query_fragment makes them (the same bits), from
// 16-byte loads: the lane's words of a head row are its kLoads pieces [u*64 + c*16, +16).
template <KvDtype D, int kMT>
__device__ __forceinline__ void resident_query(const uint8_t* natural, int stride, int lane,
                                               uint4 (&a)[kMT][kKSteps]) {
  constexpr int kLoads = KeyShape<D>::kLoads;
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    uint4 r0[kLoads], r1[kLoads];  // rows g and g + 8 of the m-tile
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      r0[u] = *reinterpret_cast<const uint4*>(natural + (mt * 16 + g) * stride + u * 64 + c * 16);
      r1[u] =
          *reinterpret_cast<const uint4*>(natural + (mt * 16 + g + 8) * stride + u * 64 + c * 16);
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if constexpr (D == KvDtype::kBf16) {
        const int w0 = 2 * ks, w1 = 2 * ks + 1;
        a[mt][ks] = make_uint4(word_of(r0[w0 / 4], w0 % 4), word_of(r1[w0 / 4], w0 % 4),
                               word_of(r0[w1 / 4], w1 % 4), word_of(r1[w1 / 4], w1 % 4));
      } else {
        const uint2 lo = e4m3x4_to_f16x4(word_of(r0[ks / 4], ks % 4));
        const uint2 hi = e4m3x4_to_f16x4(word_of(r1[ks / 4], ks % 4));
        a[mt][ks] = make_uint4(lo.x, hi.x, lo.y, hi.y);
      }
    }
  }
}

// kMT: the m-tiles of 16 heads, (heads + 15) / 16. Launched in clusters of 1, 2 or 4 blocks along
// a row (the grid's x padded to a whole number of clusters): block rank r of n quantizes heads
// [r * 64 / n, (r + 1) * 64 / n) and stores them into every block's query, so a short block pays
// 1/n of the query's loads and quantization.
template <KvDtype D, int kMT>
__global__ void __launch_bounds__(kResThreads, 2)
    indexer_logits_resident(IndexerLogitsParams p, int block_tokens, int ranks) {
  pdl_enter();
  using R = Resident<D>;
  constexpr int kStages = R::kStages;
  const int rank = int(blockIdx.x) % ranks;  // in the cluster (of ranks blocks along x)
  const int row = blockIdx.y;
  const int64_t seq_len = clamped_seq_len(p, row);
  const int64_t block_t0 = int64_t(blockIdx.x) * block_tokens;
  if (block_t0 - int64_t(rank) * block_tokens >= seq_len) return;  // the whole cluster: past
  if (ranks > 1) cluster_arrive_relaxed();  // started: the others may store into its query
  const int64_t block_end = min(seq_len, block_t0 + block_tokens);  // < block_t0: no groups

  extern __shared__ __align__(16) uint8_t smem[];  // the ring; the query in its last stage
  uint8_t* natural = smem + (kStages - 1) * R::kStageRowBytes;
  float* weight = reinterpret_cast<float*>(natural + kMaxHeads * R::kQueryStride);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto stage_of = [&](int i) {  // group i's stage of this warp
    return smem + (i % kStages) * R::kStageRowBytes + warp * Stage<D>::kBytes;
  };

  // This warp's groups: i = 0 .. groups-1 at t0 = warp_t0 + i * kResStride, inside one page.
  const int64_t warp_t0 = block_t0 + warp * kGroupTokens;
  const int groups =
      warp_t0 < block_end ? int((block_end - warp_t0 + kResStride - 1) / kResStride) : 0;
  // Their page ids (group lane in pid0, group lane + 32 in pid1), then this block's heads of the
  // query: all these loads are issued before anything waits on one.
  const int32_t* pages = p.page_table + int64_t(row) * p.ld_page_table;
  int32_t pid0 = -1, pid1 = -1;
  if (lane < groups) pid0 = pages[(warp_t0 + int64_t(lane) * kResStride) / kPageSize];
  if (lane + 32 < groups) pid1 = pages[(warp_t0 + int64_t(lane + 32) * kResStride) / kPageSize];
  const int heads_per_rank = kMaxHeads / ranks;
  auto own = [&](int h) { return h / heads_per_rank == rank; };
  QueryLoad<kResWarps> q;
  load_query(p, row, q, own);

  auto page_of = [&](int i) {  // warp-uniform i < groups
    return __shfl_sync(0xffffffffu, i < 32 ? pid0 : pid1, i & 31);
  };
  auto issue = [&](int i) {  // the copies of group i into its stage, or an empty group
    if (i < groups) {
      const int32_t page = page_of(i);
      if (valid_page(p, page)) {
        const int64_t t0 = warp_t0 + int64_t(i) * kResStride;
        const int valid = int(min(int64_t(kGroupTokens), seq_len - t0));
        stage_group<D, true>(page_base_of<D>(p, page), int(t0 % kPageSize), stage_of(i), valid);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);  // in flight while the query is prepared

  if (ranks > 1) cluster_wait();  // every block of the cluster has started
#pragma unroll
  for (int i = 0; i < QueryLoad<kResWarps>::kHeadsPerWarp; ++i) {
    const int h = warp + i * kResWarps;
    if (h >= kMT * 16 || !own(h)) continue;  // warp-uniform
    uint2 e;
    const float w = encode_head<D, true>(q.x[i], q.w[i], e);
    if (ranks == 1) {  // no cluster launched: plain shared memory
      store_head<D>(natural, R::kQueryStride, h, e);
      if (lane == 0) weight[h] = w;
    }
    for (int r = 0; r < ranks && ranks > 1; ++r) {
      cg::cluster_group cluster = cg::this_cluster();
      store_head<D>(cluster.map_shared_rank(natural, unsigned(r)), R::kQueryStride, h, e);
      if (lane == 0) cluster.map_shared_rank(weight, unsigned(r))[h] = w;
    }
  }
  if (ranks > 1) {
    cg::this_cluster().sync();  // every block's natural query and weights are complete
  } else {
    __syncthreads();
  }
  if (block_t0 >= seq_len) return;  // a block past the row that only helped with the query

  const int g = lane / 4;
  uint4 a[kMT][kKSteps];
  float w_lo[kMT], w_hi[kMT];
  resident_query<D, kMT>(natural, R::kQueryStride, lane, a);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    w_lo[mt] = weight[mt * 16 + g];
    w_hi[mt] = weight[mt * 16 + g + 8];
  }
  __syncthreads();  // every warp holds the query: its bytes become stage kStages-1

  float* logits = p.logits + int64_t(row) * p.ld_logits;
  for (int i = 0; i < groups; ++i) {
    issue(i + kStages - 1);        // into the stage group i - 1 left (or the query's)
    cp_async_wait<kStages - 1>();  // group i has landed (this lane's copies)
    __syncwarp();                  // and every lane's: the scales cross lanes
    const int32_t page = page_of(i);
    const int64_t t0 = warp_t0 + int64_t(i) * kResStride;
    if (valid_page(p, page)) {
      resident_group<D, kMT>(a, w_lo, w_hi, stage_of(i), t0, seq_len, logits);
    } else {
      bad_page_group(p, t0, seq_len, logits);
    }
    __syncwarp();  // every lane is done with stage i before it is refilled
  }
}

// Blocks per cluster of the resident variant: the override (1, 2 or 4), else 4 for short blocks
// (a long row over many SMs, where the query's preparation is a large share of a block) when the
// row has that many, else 1.
int cluster_blocks_for(int block_tokens, int64_t chunks) {
  if (const char* v = std::getenv("DSA_CUDA_INDEXER_CLUSTER")) {
    const int forced = std::atoi(v);
    if (forced == 1 || forced == 2 || forced == 4) return forced;
  }
  return block_tokens <= 1024 && chunks >= 4 ? 4 : 1;
}

template <KvDtype D, int kMT>
cudaError_t launch_tiles(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  const cudaError_t e = opt_in_smem(reinterpret_cast<const void*>(&indexer_logits_resident<D, kMT>),
                                    Resident<D>::kSmemBytes, false, opted);
  if (e != cudaSuccess) return e;
  const int64_t chunks = (p.ld_logits + block_tokens - 1) / block_tokens;
  const int ranks = cluster_blocks_for(block_tokens, chunks);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned((chunks + ranks - 1) / ranks * ranks), unsigned(p.rows));
  config.blockDim = dim3(kResThreads);
  config.dynamicSmemBytes = Resident<D>::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attrs[2] = {cluster_dimension(unsigned(ranks)), {}};
  config.attrs = attrs;
  config.numAttrs = ranks > 1 ? 1 : 0;
  add_pdl_attribute(config, attrs);
  const cudaError_t launched =
      cudaLaunchKernelEx(&config, indexer_logits_resident<D, kMT>, p, block_tokens, ranks);
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

template <KvDtype D>
cudaError_t launch_dtype(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  switch ((p.heads + 15) / 16) {
    case 1:
      return launch_tiles<D, 1>(p, block_tokens, stream);
    case 2:
      return launch_tiles<D, 2>(p, block_tokens, stream);
    case 3:
      return launch_tiles<D, 3>(p, block_tokens, stream);
    default:
      return launch_tiles<D, 4>(p, block_tokens, stream);
  }
}

}  // namespace

cudaError_t launch_resident(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  return p.pool.dtype == KvDtype::kBf16 ? launch_dtype<KvDtype::kBf16>(p, block_tokens, stream)
                                        : launch_dtype<KvDtype::kFp8>(p, block_tokens, stream);
}

}  // namespace dsa::cuda::indexer_detail
