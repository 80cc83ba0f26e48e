// Absorbed sparse MLA decode (DESIGN §1.7) on tensor cores (mma.sync m16n8k16 bf16, f32 acc),
// split over the selected tokens across the CTAs of a thread-block cluster.
//
// Launch: grid (rows * S, ceil(heads / 64)), 256 threads, clusters of (S, 1, 1). The S CTAs of a
// cluster share one (row, group of 64 heads); CTA `split` (its rank in the cluster) walks the
// chunks [split * cps, (split + 1) * cps) of the row's selected tokens, cps = ceil(chunks / S),
// 32 tokens per chunk, flash-decoding style, and keeps an unnormalized partial (m, l, o). The
// partials meet in distributed shared memory: CTA `split` combines the output dims
// [split * 512 / S, (split + 1) * 512 / S) of all 64 heads over the partials in the fixed order
// 0, 1, ..., S - 1. S depends only on topk (split_plan()), never on rows, and every CTA's work
// depends only on its row, so a row's bits are the same alone or in any batch.
//
// Inside a CTA, warp w: m-tile mt = w % 4 (16 heads) and half = w / 4.
//   S = Q K^T over 576 dims: each warp of a pair (mt, 0), (mt, 1) computes the partial over its
//       288 dims, the pair swaps partials through shared memory and both form S = S_0 + S_1, so
//       both hold identical scores and identical softmax statistics.
//   Online softmax in f32 (exp2 with scale * log2 e folded in), invalid slots masked to -inf.
//   O += P V with P rounded to bf16 from the S accumulators in registers (the C fragment of S is
//       the A fragment of P) and V = c, the first 512 latent dims; each warp of the pair owns
//       256 of the 512 output dims (128 f32 accumulators per lane).
// The chunk's latent tokens are double-buffered in shared memory as bf16 (fp8 latent is
// dequantized by its tile scale on the way in, through registers). The selected slots are staged
// in shared memory two chunks ahead, so no copy waits on a global index load.
//
// Fragment layouts relied on (PTX ISA, mma.m16n8k16 .bf16, g = lane / 4, c = lane % 4):
//   A [16 x 16] row-major, 4 regs of 2 bf16: {row g, k 2c..2c+1}, {row g+8, k 2c..}, {row g,
//       k 2c+8..}, {row g+8, k 2c+8..}. B [16 x 8] ("col"): {k 2c..2c+1, n g}, {k 2c+8.., n g}.
//   C/D [16 x 8] f32: {row g, n 2c}, {row g, n 2c+1}, {row g+8, n 2c}, {row g+8, n 2c+1}.
//   ldmatrix.x4: lanes 8i..8i+7 address the 8 rows of matrix i; register i of a lane holds row
//       lane / 4, columns 2 (lane % 4) and +1 of matrix i (.trans: of its transpose). So a C
//       fragment pair of S (n-tiles 2k, 2k+1) packed to bf16 is exactly the A fragment of P for
//       the k-step k.
// A row (or split) with no valid slot ends with l = 0, O = 0; the combine gives exact zeros and
// lse = -inf.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "dsa/token_codec.h"

namespace dsa::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kHeadsPerBlock = 64;
constexpr int kChunk = 32;               // selected tokens per step
constexpr int kMaxSplits = 8;            // CTAs per cluster: the portable cluster size
constexpr int kPitch = kLatentDim + 8;   // smem row pitch in bf16: 1168 B, no bank conflicts
constexpr int kPieces = kLatentDim / 8;  // 16-byte pieces of a bf16 token row: 72
constexpr int kLoadsPerThread = kChunk * kPieces / kThreads;  // 9
constexpr int kHalfDims = kLatentDim / 2;    // 288: the QK^T dims of one warp of a pair
constexpr int kHalfOut = kKvLoraRank / 2;    // 256: the output dims of one warp of a pair
constexpr int kPartPitch = kKvLoraRank + 8;  // f32 row pitch of the partial o: 2080 B
constexpr int kSlotStages = 3;               // chunks of staged slots: computing, fetching, next
static_assert(kChunk * kPieces % kThreads == 0);
static_assert(kKvLoraRank % (4 * kMaxSplits) == 0);

struct SmemLayout {
  static constexpr size_t kQ = 0;                                          // [64][kPitch] bf16
  static constexpr size_t kKv = kQ + size_t(kHeadsPerBlock) * kPitch * 2;  // [2][32][kPitch] bf16
  static constexpr size_t kExchange = kKv + size_t(2) * kChunk * kPitch * 2;  // [8][16][32] f32
  static constexpr size_t kSlots = kExchange + size_t(kWarps) * 16 * 32 * 4;  // [3][32] int64
  static constexpr size_t kM = kSlots + size_t(kSlotStages) * kChunk * 8;     // [64] f32
  static constexpr size_t kL = kM + kHeadsPerBlock * 4;                       // [64] f32
  static constexpr size_t kCoef = kL + kHeadsPerBlock * 4;                    // [64][8] f32
  static constexpr size_t kBytes = kCoef + size_t(kHeadsPerBlock) * kMaxSplits * 4;
  // After the token loop the partial o [64][kPartPitch] f32 overlays q and the latent buffers.
  static constexpr size_t kPart = 0;
  static constexpr size_t kPartBytes = size_t(kHeadsPerBlock) * kPartPitch * 4;
};
static_assert(SmemLayout::kPart + SmemLayout::kPartBytes <= SmemLayout::kExchange);
static_assert(SmemLayout::kBytes <= 227 * 1024, "over the sm_90 dynamic shared memory limit");

// The fixed split of a row's selected tokens: a function of topk alone (batch invariance).
struct SplitPlan {
  int splits = 1;            // CTAs per (row, head group): a power of two <= kMaxSplits
  int chunks_per_split = 0;  // consecutive chunks of kChunk tokens per CTA
};
SplitPlan split_plan(int topk) {
  const int chunks = (topk + kChunk - 1) / kChunk;
  SplitPlan plan;
  while (plan.splits * 2 <= kMaxSplits && plan.splits * 2 <= chunks) plan.splits *= 2;
  plan.chunks_per_split = (chunks + plan.splits - 1) / plan.splits;
  return plan;
}

// The two warps (mt, 0) and (mt, 1) of a pair meet at named barrier 1 + mt (0 is __syncthreads).
__device__ __forceinline__ void pair_barrier(int mt) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + mt), "r"(64) : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The raw index of selected token j of chunk `chunk` (-1 past topk). Only loaded: checked later
// by checked_slot(), so the load's latency overlaps a chunk of compute.
__device__ __forceinline__ int64_t raw_slot(const SparseMlaParams& p, const int64_t* indices,
                                            int chunk, int j) {
  const int pos = chunk * kChunk + j;
  return pos < p.topk ? __ldg(indices + pos) : int64_t(-1);
}
// The slot, or -1 when unused (negative, or past the pool).
__device__ __forceinline__ int64_t checked_slot(const SparseMlaParams& p, int64_t slot) {
  return (slot < 0 || slot >= p.pool.capacity()) ? int64_t(-1) : slot;
}

// Fetches one chunk into kv (one buffer, [32][kPitch]) from its staged slots [32]. bf16:
// cp.async for every piece. fp8: the rope pieces go by cp.async, the 8-value e4m3 pieces into
// registers (raw, scale) that store_fp8_pieces() dequantizes later, so their latency overlaps the
// compute of a chunk. Unused tokens are zeros.
template <KvDtype D>
__device__ void fetch_chunk(const SparseMlaParams& p, const int64_t* slots, __nv_bfloat16* kv,
                            uint2 (&raw)[kLoadsPerThread], float (&scale)[kLoadsPerThread]) {
#pragma unroll
  for (int i = 0; i < kLoadsPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int token = idx / kPieces, piece = idx % kPieces;
    const int64_t slot = slots[token];
    __nv_bfloat16* dst = kv + token * kPitch + piece * 8;
    if constexpr (D == KvDtype::kBf16) {
      if (slot >= 0) {
        cp_async16(dst, p.pool.data + slot * (kLatentDim * 2) + piece * 16);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    } else {
      raw[i] = make_uint2(0, 0);
      scale[i] = 0.0f;
      if (slot < 0) {
        if (piece >= kKvLoraRank / 8) *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        continue;
      }
      const uint8_t* src = p.pool.data + slot * kLatentFp8TokenBytes;
      if (piece >= kKvLoraRank / 8) {  // rope: 8 bf16 as they are
        cp_async16(dst, src + kLatentFp8RopeOffset + (piece - kKvLoraRank / 8) * 16);
      } else {
        raw[i] = __ldg(reinterpret_cast<const uint2*>(src + piece * 8));
        scale[i] = __ldg(reinterpret_cast<const float*>(src + kLatentFp8ScaleOffset) +
                         piece * 8 / kLatentTile);
      }
    }
  }
  cp_async_commit();
}

// fp8 only: e4m3 * tile scale, rounded to bf16, into the chunk's buffer (zeros for unused).
__device__ __forceinline__ uint32_t dequant_pair(uint16_t two, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16(f.x * s, f.y * s);
}
__device__ void store_fp8_pieces(__nv_bfloat16* kv, const uint2 (&raw)[kLoadsPerThread],
                                 const float (&scale)[kLoadsPerThread]) {
#pragma unroll
  for (int i = 0; i < kLoadsPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int token = idx / kPieces, piece = idx % kPieces;
    if (piece >= kKvLoraRank / 8) continue;
    uint4 v;
    v.x = dequant_pair(uint16_t(raw[i].x), scale[i]);
    v.y = dequant_pair(uint16_t(raw[i].x >> 16), scale[i]);
    v.z = dequant_pair(uint16_t(raw[i].y), scale[i]);
    v.w = dequant_pair(uint16_t(raw[i].y >> 16), scale[i]);
    *reinterpret_cast<uint4*>(kv + token * kPitch + piece * 8) = v;
  }
}

// q of the block's 64 heads, rounded to bf16; heads past p.heads are zero.
// Read in batches of kBatch 4-float pieces per thread, all loads of a batch in flight at once
// (16-byte loads when the row is 16-byte aligned; a head's 576 floats keep that alignment).
__device__ void load_queries(const SparseMlaParams& p, int row, int head0, __nv_bfloat16* q_s) {
  constexpr int kRowPieces = kLatentDim / 4;                          // 144 per head
  constexpr int kPerThread = kHeadsPerBlock * kRowPieces / kThreads;  // 36
  constexpr int kBatch = 12;
  static_assert(kHeadsPerBlock * kRowPieces % kThreads == 0 && kPerThread % kBatch == 0);
  const float* q = p.q + int64_t(row) * p.ld_q;
  const bool aligned = (reinterpret_cast<uintptr_t>(q) & 15u) == 0;
  for (int b0 = 0; b0 < kPerThread; b0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int piece = threadIdx.x + (b0 + i) * kThreads;
      const int h = piece / kRowPieces, d = piece % kRowPieces * 4;
      v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (head0 + h >= p.heads) continue;
      const float* src = q + int64_t(head0 + h) * kLatentDim + d;
      v[i] = aligned ? __ldg(reinterpret_cast<const float4*>(src))
                     : make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int piece = threadIdx.x + (b0 + i) * kThreads;
      const int h = piece / kRowPieces, d = piece % kRowPieces * 4;
      *reinterpret_cast<uint2*>(q_s + h * kPitch + d) =
          make_uint2(pack_bf16(v[i].x, v[i].y), pack_bf16(v[i].z, v[i].w));
    }
  }
}

// Partial S[16 heads, 32 tokens] of this warp over its 288 dims.
__device__ __forceinline__ void partial_scores(const __nv_bfloat16* q_s, const __nv_bfloat16* kv,
                                               int mt, int half, float (&s)[4][4]) {
  const int lane = threadIdx.x % 32;
  const uint32_t a_base =
      smem_addr(q_s + (mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch + (lane / 16) * 8);
  const uint32_t b_base =
      smem_addr(kv + ((lane / 16) * 8 + (lane % 8)) * kPitch + ((lane / 8) % 2) * 8);
#pragma unroll
  for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 6
  for (int ks = 0; ks < kHalfDims / 16; ++ks) {
    const uint32_t k_bytes = uint32_t(half * kHalfDims + ks * 16) * 2;
    uint32_t a[4], b01[4], b23[4];
    ldmatrix_x4(a, a_base + k_bytes);
    ldmatrix_x4(b01, b_base + k_bytes);
    ldmatrix_x4(b23, b_base + k_bytes + 16 * kPitch * 2);
    mma_bf16(s[0], a, b01[0], b01[1]);
    mma_bf16(s[1], a, b01[2], b01[3]);
    mma_bf16(s[2], a, b23[0], b23[1]);
    mma_bf16(s[3], a, b23[2], b23[3]);
  }
}

// O[16 heads, 256 dims of this half] += P[16, 32] V[32, 256].
__device__ __forceinline__ void accumulate_pv(const __nv_bfloat16* kv, int half,
                                              const float (&pr)[4][4], float (&o)[32][4]) {
  const int lane = threadIdx.x % 32;
  const uint32_t v_base = smem_addr(kv + (((lane / 8) % 2) * 8 + (lane % 8)) * kPitch +
                                    half * kHalfOut + (lane / 16) * 8);
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const uint32_t a[4] = {pack_bf16(pr[2 * kk][0], pr[2 * kk][1]),
                           pack_bf16(pr[2 * kk][2], pr[2 * kk][3]),
                           pack_bf16(pr[2 * kk + 1][0], pr[2 * kk + 1][1]),
                           pack_bf16(pr[2 * kk + 1][2], pr[2 * kk + 1][3])};
#pragma unroll
    for (int jp = 0; jp < 16; ++jp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_base + uint32_t(kk * 16 * kPitch + jp * 16) * 2);
      mma_bf16(o[2 * jp], a, b[0], b[1]);
      mma_bf16(o[2 * jp + 1], a, b[2], b[3]);
    }
  }
}

// The cluster's combine, after every CTA has left its partial in shared memory: part [64]
// [kPartPitch] o (unnormalized), m [64] (log2 units, -inf when the split saw no valid slot) and
// l [64]. Phase 1: per head, the weights of the splits, w_s = 2^(m_s - M) / L with M = max m_s and
// L = sum_s l_s 2^(m_s - M), in split order. Phase 2: this CTA's slice of the output dims,
// out = sum_s w_s o_s in split order. The same order for every row and every batch.
__device__ void combine_splits(const SparseMlaParams& p, cg::cluster_group& cluster, int splits,
                               int split, int row, int head0, uint8_t* smem) {
  auto* coef = reinterpret_cast<float*>(smem + SmemLayout::kCoef);
  if (threadIdx.x < kHeadsPerBlock) {
    const int h = threadIdx.x;
    float ms[kMaxSplits], ls[kMaxSplits];
    float m_max = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s >= splits) break;
      ms[s] = cluster.map_shared_rank(reinterpret_cast<float*>(smem + SmemLayout::kM), s)[h];
      ls[s] = cluster.map_shared_rank(reinterpret_cast<float*>(smem + SmemLayout::kL), s)[h];
      m_max = fmaxf(m_max, ms[s]);
    }
    float l_sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s >= splits) break;
      ms[s] = ms[s] == -INFINITY ? 0.0f : exp2f(ms[s] - m_max);  // the split's weight
      l_sum += ls[s] * ms[s];
    }
    const float inv = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s >= splits) break;
      coef[h * kMaxSplits + s] = ms[s] * inv;
    }
    if (p.lse != nullptr && split == 0 && head0 + h < p.heads) {
      p.lse[int64_t(row) * p.heads + head0 + h] =
          l_sum > 0.0f ? (m_max + log2f(l_sum)) * 0.6931471805599453f : -INFINITY;
    }
  }
  __syncthreads();  // coef is complete

  const int vecs = kKvLoraRank / splits / 4;  // float4s of this CTA's slice, per head
  const int d0 = split * (kKvLoraRank / splits);
  for (int it = threadIdx.x; it < kHeadsPerBlock * vecs; it += kThreads) {
    const int h = it / vecs, d = d0 + (it % vecs) * 4;
    if (head0 + h >= p.heads) continue;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s >= splits) break;
      const float* part =
          cluster.map_shared_rank(reinterpret_cast<float*>(smem + SmemLayout::kPart), s);
      const float4 v = *reinterpret_cast<const float4*>(part + h * kPartPitch + d);
      const float w = coef[h * kMaxSplits + s];
      acc.x = fmaf(v.x, w, acc.x), acc.y = fmaf(v.y, w, acc.y);
      acc.z = fmaf(v.z, w, acc.z), acc.w = fmaf(v.w, w, acc.w);
    }
    float* out = p.out + int64_t(row) * p.ld_out + int64_t(head0 + h) * kKvLoraRank + d;
    out[0] = acc.x, out[1] = acc.y, out[2] = acc.z, out[3] = acc.w;  // ld_out may be odd
  }
}

template <KvDtype D>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_kernel(SparseMlaParams p, SplitPlan plan) {
  extern __shared__ __align__(16) uint8_t smem[];
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem + SmemLayout::kQ);
  auto* kv_s = reinterpret_cast<__nv_bfloat16*>(smem + SmemLayout::kKv);
  auto* exchange = reinterpret_cast<float*>(smem + SmemLayout::kExchange);
  auto* slots_s = reinterpret_cast<int64_t*>(smem + SmemLayout::kSlots);

  cg::cluster_group cluster = cg::this_cluster();
  const int split = int(cluster.block_rank());  // blockIdx.x % plan.splits
  const int row = blockIdx.x / plan.splits, head0 = blockIdx.y * kHeadsPerBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int mt = warp % 4, half = warp / 4;
  const int g = lane / 4, c = lane % 4;
  const int64_t* indices = p.indices + int64_t(row) * p.ld_indices;
  const int chunk0 = split * plan.chunks_per_split;
  const int total_chunks = (p.topk + kChunk - 1) / kChunk;
  const int n_chunks = max(0, min(plan.chunks_per_split, total_chunks - chunk0));
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // Prologue: the slots of the first two chunks, q, and the first chunk's tokens.
  if (threadIdx.x < kChunk) {
    for (int i = 0; i < 2 && i < n_chunks; ++i) {
      slots_s[i * kChunk + threadIdx.x] =
          checked_slot(p, raw_slot(p, indices, chunk0 + i, threadIdx.x));
    }
  }
  uint2 raw[kLoadsPerThread];
  float tile_scale[kLoadsPerThread];
  __syncthreads();  // the staged slots are visible
  if (n_chunks > 0) fetch_chunk<D>(p, slots_s, kv_s, raw, tile_scale);
  load_queries(p, row, head0, q_s);  // while chunk 0 is in flight
  if constexpr (D == KvDtype::kFp8) {
    if (n_chunks > 0) store_fp8_pieces(kv_s, raw, tile_scale);
  }

  float o[32][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, log2 units
  for (int ch = 0; ch < n_chunks; ++ch) {
    const int buf = ch & 1;
    __nv_bfloat16* kv = kv_s + buf * kChunk * kPitch;
    const int64_t* slots = slots_s + (ch % kSlotStages) * kChunk;
    const bool prefetch = ch + 1 < n_chunks;
    const bool stage = threadIdx.x < kChunk && ch + 2 < n_chunks;
    cp_async_wait<0>();  // this thread's copies of chunk ch have landed
    // Chunk ch (and q) is visible to all, and every warp is done with step ch - 1: its latent
    // buffer (the other one), its slot stage ((ch + 2) % 3) and the exchange area may be
    // overwritten from here on.
    __syncthreads();
    if (prefetch) {
      fetch_chunk<D>(p, slots_s + ((ch + 1) % kSlotStages) * kChunk,
                     kv_s + (buf ^ 1) * kChunk * kPitch, raw, tile_scale);
    }
    const int64_t next_slot = stage ? raw_slot(p, indices, chunk0 + ch + 2, threadIdx.x) : -1;

    float s[4][4];
    partial_scores(q_s, kv, mt, half, s);
    float* mine = exchange + warp * 16 * 32;
    const float* partner = exchange + (warp ^ 4) * 16 * 32;
#pragma unroll
    for (int i = 0; i < 16; ++i) mine[i * 32 + lane] = s[i / 4][i % 4];
    pair_barrier(mt);
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i / 4][i % 4] += partner[i * 32 + lane];  // S_0 + S_1 in both

    // Online softmax over the chunk: columns n*8 + c*2 + j, rows g (regs 0,1) and g+8 (2,3).
    float cmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool ok = slots[n * 8 + c * 2 + j] >= 0;
        s[n][j] = ok ? s[n][j] * scale_log2 : -INFINITY;
        s[n][2 + j] = ok ? s[n][2 + j] * scale_log2 : -INFINITY;
        cmax[0] = fmaxf(cmax[0], s[n][j]);
        cmax[1] = fmaxf(cmax[1], s[n][2 + j]);
      }
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      cmax[r] = fmaxf(cmax[r], __shfl_xor_sync(0xffffffffu, cmax[r], 1));
      cmax[r] = fmaxf(cmax[r], __shfl_xor_sync(0xffffffffu, cmax[r], 2));
      const float m_new = fmaxf(m[r], cmax[r]);
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // nothing valid yet: every p is 0
      alpha[r] = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - m_use[e / 2]);
        l[e / 2] += s[n][e];
      }
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[j][0] *= alpha[0], o[j][1] *= alpha[0];
      o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    }
    accumulate_pv(kv, half, s, o);
    if constexpr (D == KvDtype::kFp8) {
      if (prefetch) store_fp8_pieces(kv_s + (buf ^ 1) * kChunk * kPitch, raw, tile_scale);
    }
    if (stage)
      slots_s[((ch + 2) % kSlotStages) * kChunk + threadIdx.x] = checked_slot(p, next_slot);
  }

  // The partial of this split: row sums over the quad, then o, m, l into shared memory (o over
  // q and the latent buffers, which every warp is done with after the barrier).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();
  auto* part = reinterpret_cast<float*>(smem + SmemLayout::kPart);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = mt * 16 + g + r * 8;
    float* dst = part + h * kPartPitch + half * kHalfOut + c * 2;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
    }
    if (half == 0 && c == 0) {
      reinterpret_cast<float*>(smem + SmemLayout::kM)[h] = m[r];
      reinterpret_cast<float*>(smem + SmemLayout::kL)[h] = l[r];
    }
  }
  cluster.sync();  // every split's partial is complete and visible to the cluster
  combine_splits(p, cluster, plan.splits, split, row, head0, smem);
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <KvDtype D>
cudaError_t launch(const SparseMlaParams& p, cudaStream_t stream) {
  const cudaError_t e = cudaFuncSetAttribute(
      sparse_mla_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(SmemLayout::kBytes));
  if (e != cudaSuccess) return e;
  const SplitPlan plan = split_plan(p.topk);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(p.rows) * unsigned(plan.splits),
                        unsigned((p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = SmemLayout::kBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = unsigned(plan.splits);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t launched = cudaLaunchKernelEx(&config, sparse_mla_kernel<D>, p, plan);
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

}  // namespace

cudaError_t sparse_mla(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.topk < 0) return cudaErrorInvalidValue;
  return p.pool.dtype == KvDtype::kBf16 ? launch<KvDtype::kBf16>(p, stream)
                                        : launch<KvDtype::kFp8>(p, stream);
}

}  // namespace dsa::cuda
