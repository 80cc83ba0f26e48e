// The data movement of the sparse MLA kernels (sparse_mla.cu, mma.sync, and sparse_mla_wgmma.cu,
// wgmma; their header comments have the designs): the shared-memory layout of each mma.sync
// variant (m-tiles per CTA, ring depth), the split plan, the selected slots, the latent chunks'
// copies into shared memory (bf16 rows; fp8 raw bytes and their dequant to bf16) in either
// kernel's row layout (padded rows, or the 128-byte-swizzled tiles of wgmma) and the online
// softmax step. The cluster's side (q's distribution, the combine, the launch) is in
// sparse_mla_split.cuh.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma.cuh"
#include "dsa/ops.h"
#include "dsa/token_codec.h"

namespace dsa::cuda::sparse_mla_detail {

namespace cg = cooperative_groups;

constexpr int kChunk = 32;          // selected tokens per step
constexpr int kMaxSplits = 16;      // CTAs per cluster at most (16: a non-portable cluster size)
constexpr int kPortableSplits = 8;  // the portable cluster size
// The default bound on splits per row (DSA_CUDA_SPARSE_MLA_MAX_SPLITS moves it; max_splits). Since
// 2026-12-04 4, was 8: every split pays a fixed q broadcast and combine through distributed shared
// memory, about 11 us a CTA against the 7.3 us token loop of 4 chunks of 64 (ws at 8 splits, its
// phase trace, bench/results/2026-12-04-h200-mla-splits.md). At 4 splits the V3.2 decode step is
// 2-9% faster at B = 8 / 64 / 256 and 2% slower at B = 1.
constexpr int kDefaultSplits = 4;
constexpr int kPitch = kLatentDim + 8;        // smem row pitch in bf16: 1168 B, no bank conflicts
constexpr int kPieces = kLatentDim / 8;       // 16-byte pieces of a bf16 token row: 72
constexpr int kHalfDims = kLatentDim / 2;     // 288: the QK^T dims of one warp of a pair
constexpr int kHalfOut = kKvLoraRank / 2;     // 256: the output dims of one warp of a pair
constexpr int kPartPitch = kKvLoraRank + 8;   // f32 row pitch of the partial o: 2080 B
constexpr int kUnitValues = kLatentTile / 2;  // fp8: e4m3 values per dequant unit: 64
constexpr int kUnits = kKvLoraRank / kUnitValues;            // fp8: units per token: 8
constexpr int kRopePieces = (kLatentDim - kKvLoraRank) / 8;  // 16-byte rope pieces per token: 8
constexpr size_t kSmemLimit = 227 * 1024;                    // sm_90 dynamic shared memory per CTA
static_assert(kKvLoraRank % (4 * kMaxSplits) == 0);
static_assert(kLatentTile % kUnitValues == 0 && kUnitValues % 16 == 0);

// The fixed split of a row's selected tokens: a function of topk, the process's split bound and
// the kernel's chunk (kChunk tokens; the wgmma64 kernel's 64) alone, never of the batch (batch
// invariance). Every kernel uses it.
struct SplitPlan {
  int splits = 1;            // CTAs per (row, head group): a power of two <= max_splits
  int chunks_per_split = 0;  // consecutive chunks of chunk_tokens per CTA
  // Heads per CTA where the launcher chooses it (the warp-specialized kernel: 16, 32 or 64 of its
  // 64 rows; 0: the kernel's own). Heads are independent, so it never changes a bit.
  int heads_per_cta = 0;
  // The warp-specialized kernel: every CTA copies its heads' q from L2 instead of the cluster
  // sharing it (q_source). The same values, so the same bits.
  bool q_from_l2 = false;
};
inline SplitPlan split_plan(int topk, int max_splits, int chunk_tokens = kChunk) {
  const int chunks = (topk + chunk_tokens - 1) / chunk_tokens;
  SplitPlan plan;
  while (plan.splits * 2 <= max_splits && plan.splits * 2 <= chunks) plan.splits *= 2;
  plan.chunks_per_split = (chunks + plan.splits - 1) / plan.splits;
  return plan;
}

// The shared memory of one variant: kTiles m-tiles of 16 heads (2 kTiles warps), chunks landing
// in a ring of `stages` (bf16: the bf16 rows themselves; fp8: the raw bytes, dequantized into a
// ring of 2 bf16 buffers). Offsets in bytes.
constexpr int kRawRopeBytes = (kLatentDim - kKvLoraRank) * 2;  // fp8 raw stage: rope, 128 B/token
constexpr size_t kRawStageBytes =                              // e4m3, rope, unit scales
    size_t(kChunk) * (kKvLoraRank + kRawRopeBytes + kUnits * 4);
struct Smem {
  int kv_stages;
  size_t q, kv, raw, exchange, slots, m, l, coef, bytes;
};
constexpr Smem smem_layout(KvDtype dtype, int tiles, int stages) {
  const int heads = 16 * tiles, warps = 2 * tiles;
  const bool fp8 = dtype == KvDtype::kFp8;
  Smem s{};
  s.kv_stages = fp8 ? 2 : stages;
  s.q = 0;                                                           // [heads][kPitch] bf16
  s.kv = s.q + size_t(heads) * kPitch * 2;                           // [kv_stages][32][kPitch] bf16
  s.raw = s.kv + size_t(s.kv_stages) * kChunk * kPitch * 2;          // fp8: [stages] raw stages
  s.exchange = s.raw + (fp8 ? size_t(stages) * kRawStageBytes : 0);  // [warps][16][32] f32
  // fp8: the exchange lives in the raw stage of the chunk being computed, dead once dequantized.
  s.slots = s.exchange + (fp8 ? 0 : size_t(warps) * 16 * 32 * 4);  // [stages + 1][32] int64
  s.m = s.slots + size_t(stages + 1) * kChunk * 8;                 // [heads] f32
  s.l = s.m + size_t(heads) * 4;                                   // [heads] f32
  s.coef = s.l + size_t(heads) * 4;                                // [heads][kMaxSplits] f32
  s.bytes = s.coef + size_t(heads) * kMaxSplits * 4;
  return s;
}
// The deepest ring (at most 4 chunks) that fits.
constexpr int stages_for(KvDtype dtype, int tiles) {
  int stages = 4;
  while (stages > 2 && smem_layout(dtype, tiles, stages).bytes > kSmemLimit) --stages;
  return stages;
}

template <KvDtype D, int kTiles>
struct Variant {
  static constexpr int kWarps = 2 * kTiles;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kHeads = 16 * kTiles;
  static constexpr int kStages = stages_for(D, kTiles);
  static constexpr Smem kSmem = smem_layout(D, kTiles, kStages);
  // After the token loop the partial o [kHeads][kPartPitch] f32 overlays q and the latent ring.
  static constexpr size_t kPartBytes = size_t(kHeads) * kPartPitch * 4;
  static_assert(kSmem.bytes <= kSmemLimit, "over the sm_90 dynamic shared memory limit");
  static_assert(kPartBytes <= kSmem.slots);
  static_assert(size_t(kWarps) * 16 * 32 * 4 <= kRawStageBytes);  // fp8 exchange
  static_assert(kChunk * kPieces % kThreads == 0 && kChunk * kUnits % kThreads == 0);
  static_assert(kThreads >= kChunk && kHeads <= kThreads);
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The raw index of selected token j of chunk `chunk` of chunk_tokens (-1 past topk). Only loaded:
// checked later by checked_slot(), so the load's latency overlaps a chunk of compute.
__device__ __forceinline__ int64_t raw_slot(const SparseMlaParams& p, const int64_t* indices,
                                            int chunk, int j, int chunk_tokens = kChunk) {
  const int pos = chunk * chunk_tokens + j;
  return pos < p.topk ? __ldg(indices + pos) : int64_t(-1);
}
// The slot, or -1 when unused (negative, or past the pool).
__device__ __forceinline__ int64_t checked_slot(const SparseMlaParams& p, int64_t slot) {
  return (slot < 0 || slot >= p.pool.capacity()) ? int64_t(-1) : slot;
}

// Where a token's (or head's) bf16 row lives in shared memory: row_at(r, d) is the address of
// dim d (a multiple of 4) of row r.
//   PaddedRows: rows of kPitch bf16 (the mma.sync kernel).
//   SwizzledRows<kRows>: kLatentDim / 64 tiles of [kRows][64 dims], each 128-byte swizzled and
//       K-major (wgmma.cuh), tile b (dims [64 b, 64 b + 64)) at b * kRows * 128 bytes; the base
//       1024-aligned (the wgmma kernel).
struct PaddedRows {
  __nv_bfloat16* base;
  __device__ __forceinline__ __nv_bfloat16* operator()(int r, int d) const {
    return base + r * kPitch + d;
  }
};
template <int kRows>
struct SwizzledRows {
  uint8_t* base;
  __device__ __forceinline__ __nv_bfloat16* operator()(int r, int d) const {
    return reinterpret_cast<__nv_bfloat16*>(base + (d / 64) * (kRows * kSwizzleRowBytes) +
                                            swizzle128_offset(r, (d % 64) / 8)) +
           d % 8;
  }
};

// What one CTA works on: split `split` of head group head0 / heads_per_cta of row `row`, the
// chunks [chunk0, chunk0 + n_chunks) of the row's selected tokens (n_chunks may be 0). CTA x is
// x = (row * groups + group) * splits + split: the head groups of a row run side by side, so
// the second reads the row's latent rows from L2. Chunks of chunk_tokens (the kernel's, as in its
// split plan).
struct CtaWork {
  int split, row, head0, chunk0, n_chunks;
  int heads;               // the CTA's heads that exist: head0 .. head0 + heads - 1
  const int64_t* indices;  // the row's selected slots
};
__device__ __forceinline__ CtaWork cta_work(const SparseMlaParams& p, const SplitPlan& plan,
                                            int heads_per_cta, int split,
                                            int chunk_tokens = kChunk) {
  CtaWork w;
  const int groups = (p.heads + heads_per_cta - 1) / heads_per_cta;
  w.split = split;  // blockIdx.x % plan.splits: the CTA's rank in its cluster
  w.row = int(blockIdx.x / plan.splits) / groups;
  w.head0 = int(blockIdx.x / plan.splits) % groups * heads_per_cta;
  w.heads = min(heads_per_cta, p.heads - w.head0);
  w.indices = p.indices + int64_t(w.row) * p.ld_indices;
  w.chunk0 = split * plan.chunks_per_split;
  const int total_chunks = (p.topk + chunk_tokens - 1) / chunk_tokens;
  w.n_chunks = max(0, min(plan.chunks_per_split, total_chunks - w.chunk0));
  return w;
}

// One chunk's place in the rings: its bf16 rows and, for fp8, its raw stage: the e4m3 values, the
// rope (bf16 as stored) and the scale of each 64-value unit.
struct Stage {
  __nv_bfloat16* kv;  // [32][kPitch]
  uint8_t* raw;       // fp8: [32][512] e4m3
  uint8_t* rope;      // fp8: [32][128 B]
  float* scale;       // fp8: [32][kUnits]
};

// Starts the copies of one chunk from its staged slots [32] (the caller commits the group).
// bf16: cp.async for every 16-byte piece into rows (st.kv is unused), zeros for unused tokens. fp8:
// into the raw stage, the e4m3 values by units of 64 (4 pieces) with the unit's tile scale (4
// bytes) beside them, and the rope by 16-byte pieces; dequantize_chunk() makes the bf16 rows (zeros
// for unused tokens).
template <KvDtype D, int kThreads, class Rows>
__device__ __forceinline__ void fetch_chunk(const SparseMlaParams& p, const int64_t* slots,
                                            const Stage& st, Rows rows) {
  if constexpr (D == KvDtype::kBf16) {
#pragma unroll
    for (int i = 0; i < kChunk * kPieces / kThreads; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int token = idx / kPieces, piece = idx % kPieces;
      const int64_t slot = slots[token];
      __nv_bfloat16* dst = rows(token, piece * 8);
      if (slot >= 0) {
        cp_async16(dst, p.pool.data + slot * (kLatentDim * 2) + piece * 16);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kChunk * kUnits / kThreads; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int token = idx / kUnits, unit = idx % kUnits;
      const int64_t slot = slots[token];
      if (slot < 0) continue;
      const uint8_t* src = p.pool.data + slot * kLatentFp8TokenBytes;
      uint8_t* dst = st.raw + token * kKvLoraRank + unit * kUnitValues;
#pragma unroll
      for (int j = 0; j < kUnitValues / 16; ++j) {
        cp_async16(dst + j * 16, src + unit * kUnitValues + j * 16);
      }
      cp_async4(st.scale + token * kUnits + unit,
                src + kLatentFp8ScaleOffset + unit * kUnitValues / kLatentTile * 4);
    }
    static_assert(kChunk * kRopePieces % kThreads == 0);
#pragma unroll
    for (int i = 0; i < kChunk * kRopePieces / kThreads; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int token = idx / kRopePieces, piece = idx % kRopePieces;
      const int64_t slot = slots[token];
      if (slot < 0) continue;
      cp_async16(st.rope + token * kRawRopeBytes + piece * 16,
                 p.pool.data + slot * kLatentFp8TokenBytes + kLatentFp8RopeOffset + piece * 16);
    }
  }
}

// fp8 only: the chunk's bf16 rows from its raw stage: c = e4m3 * tile scale rounded to bf16, the
// rope as it is, zeros for unused tokens. Each thread converts the units and rope pieces it
// copied itself in fetch_chunk(), so its own cp.async wait is all it needs; the step's barrier
// then publishes the rows.
__device__ __forceinline__ uint32_t dequant_pair(uint16_t two, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16(f.x * s, f.y * s);
}
template <int kThreads, class Rows>
__device__ __forceinline__ void dequantize_chunk(const int64_t* slots, const Stage& st, Rows rows) {
#pragma unroll
  for (int i = 0; i < kChunk * kUnits / kThreads; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int token = idx / kUnits, unit = idx % kUnits;
    const bool used = slots[token] >= 0;
    const float s = used ? st.scale[token * kUnits + unit] : 0.0f;
#pragma unroll
    for (int j0 = 0; j0 < kUnitValues / 16; ++j0) {
      // Rotated by unit pair: the 8 units of a token read 8 distinct bank groups at once.
      const int j = (j0 + unit / 2) % (kUnitValues / 16);
      uint4 lo = make_uint4(0, 0, 0, 0), hi = make_uint4(0, 0, 0, 0);
      if (used) {
        const uint4 v = *reinterpret_cast<const uint4*>(st.raw + token * kKvLoraRank +
                                                        unit * kUnitValues + j * 16);
        lo.x = dequant_pair(uint16_t(v.x), s), lo.y = dequant_pair(uint16_t(v.x >> 16), s);
        lo.z = dequant_pair(uint16_t(v.y), s), lo.w = dequant_pair(uint16_t(v.y >> 16), s);
        hi.x = dequant_pair(uint16_t(v.z), s), hi.y = dequant_pair(uint16_t(v.z >> 16), s);
        hi.z = dequant_pair(uint16_t(v.w), s), hi.w = dequant_pair(uint16_t(v.w >> 16), s);
      }
      // Odd units store their upper half first: the 8 units' stores of one instruction land in 8
      // distinct 16-byte bank groups (chunk 2 j + unit % 2 of a 128-byte row, in either layout).
      const bool odd = unit % 2 != 0;
      *reinterpret_cast<uint4*>(rows(token, unit * kUnitValues + j * 16 + (odd ? 8 : 0))) =
          odd ? hi : lo;
      *reinterpret_cast<uint4*>(rows(token, unit * kUnitValues + j * 16 + (odd ? 0 : 8))) =
          odd ? lo : hi;
    }
  }
#pragma unroll
  for (int i = 0; i < kChunk * kRopePieces / kThreads; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int token = idx / kRopePieces, piece = idx % kRopePieces;
    const uint4 v =
        slots[token] >= 0
            ? *reinterpret_cast<const uint4*>(st.rope + token * kRawRopeBytes + piece * 16)
            : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(rows(token, kKvLoraRank + piece * 8)) = v;
  }
}

// One chunk's online-softmax step of a thread that holds rows g and g + 8 (g = lane / 4) of its
// warp's 16 rows of S over the chunk's 32 tokens in the m16n8 C / wgmma D layout: s[4 n + e] is
// row g + 8 (e / 2), token 8 n + 2 c + e % 2 (c = lane % 4). Scales s to log2 units (scale_log2 =
// scale * log2 e), masks the tokens whose staged slot is -1 to -inf, takes the row max over the
// quad, turns s into p = 2^(s - m) in place, updates m (log2 units, -inf until a valid token)
// and l, and rescales o (any accumulator in the same layout: element k is of row (k % 4) / 2)
// unless no row max of the warp moved (o * 1 is o: the same bits either way). Both kernels run
// exactly this sequence: softmax_scores() (all but the rescale; it returns whether o must be
// rescaled, the same in every lane of the warp, and the factors alpha), then rescale_rows().
// The wgmma kernel's overlapped schedule runs the two apart (o is still being accumulated by
// the previous chunk's P V in between), on the same values. softmax_scores() is mask_scores()
// then update_softmax(); the wgmma64 kernel runs those two apart, the chunk's row max shared
// between its warpgroups in between.
template <class Slot>
__device__ __forceinline__ void mask_scores(float (&s)[16], const Slot* slots, int c,
                                            float scale_log2, float (&cmax)[2]) {
  cmax[0] = cmax[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool ok = slots[n * 8 + c * 2 + j] >= 0;
      s[4 * n + j] = ok ? s[4 * n + j] * scale_log2 : -INFINITY;
      s[4 * n + 2 + j] = ok ? s[4 * n + 2 + j] * scale_log2 : -INFINITY;
      cmax[0] = fmaxf(cmax[0], s[4 * n + j]);
      cmax[1] = fmaxf(cmax[1], s[4 * n + 2 + j]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    cmax[r] = fmaxf(cmax[r], __shfl_xor_sync(0xffffffffu, cmax[r], 1));
    cmax[r] = fmaxf(cmax[r], __shfl_xor_sync(0xffffffffu, cmax[r], 2));
  }
}
// The rest of the step, given the chunk's row maxima cmax (log2 units, -inf: no valid token).
__device__ __forceinline__ bool update_softmax(float (&s)[16], const float (&cmax)[2],
                                               float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  float m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(m[r], cmax[r]);
    m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // nothing valid yet: every p is 0
    alpha[r] = exp2f(m[r] - m_use[r]);
    m[r] = m_new;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    s[i] = exp2f(s[i] - m_use[(i % 4) / 2]);
    l[(i % 4) / 2] += s[i];
  }
  return __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f);
}
__device__ __forceinline__ bool softmax_scores(float (&s)[16], const int64_t* slots, int c,
                                               float scale_log2, float (&m)[2], float (&l)[2],
                                               float (&alpha)[2]) {
  float cmax[2];
  mask_scores(s, slots, c, scale_log2, cmax);
  return update_softmax(s, cmax, m, l, alpha);
}
template <int kO>
__device__ __forceinline__ void rescale_rows(float (&o)[kO], const float (&alpha)[2]) {
#pragma unroll
  for (int k = 0; k < kO; ++k) o[k] *= alpha[(k % 4) / 2];
}
template <int kO>
__device__ __forceinline__ void softmax_step(float (&s)[16], const int64_t* slots, int c,
                                             float scale_log2, float (&m)[2], float (&l)[2],
                                             float (&o)[kO]) {
  float alpha[2];
  if (softmax_scores(s, slots, c, scale_log2, m, l, alpha)) rescale_rows(o, alpha);
}

// O += P V over kSteps k16 steps of the chunk's tokens (ascending) and this warpgroup's kOutTiles
// n64 tiles of O: A = P from registers (a[kk], wgmma.cuh's register-A layout), B = V MN-major,
// the 64-dim tile wg * kOutTiles + nb of the chunk at `tile` (kTileBytes apart), k16 step kk two
// swizzle atoms further; fenced and committed as one group. The caller has fenced o and a where
// it last wrote them, and waits for the group.
template <int kSteps, int kOutTiles, int kTileBytes>
__device__ __forceinline__ void issue_pv_group(float (&o)[kOutTiles][32],
                                               const uint32_t (&a)[kSteps][4], uint32_t tile,
                                               int wg) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int nb = 0; nb < kOutTiles; ++nb) {
      const uint32_t v =
          tile + uint32_t((wg * kOutTiles + nb) * kTileBytes + kk * 2 * kSwizzleAtomBytes);
      wgmma_bf16_rs_mn64(o[nb], a[kk], wgmma_desc_sw128_mn(v, kTileBytes));
    }
  }
  wgmma_commit();
}

}  // namespace dsa::cuda::sparse_mla_detail
