// Absorbed sparse MLA decode (DESIGN §1.7) with the heads as the MMA's N: the
// DSA_CUDA_SPARSE_MLA_VARIANT=hn kernel, for small batches. Its own bits (batch-invariant like
// every family, so a process picks one family for its life; sparse_mla.cu).
//
// Why. The 64-row kernels (ws, wgmma64, wgmma) put heads on wgmma's M, which is 64 rows: a CTA
// holding 16 heads still pays for 64 rows, so a 64-token chunk costs ~2 us whatever the heads
// (ws at B = 1 on an H100: 8.3 us of token loop in a CTA life of 15.4 at 8 splits,
// bench/results/2026-12-05-h100-mla.md). At B = 1 a split's CTA has only 16 heads to give, and the
// token loop is most of the launch. Here the chunk's tokens are M and the CTA's 16 heads are N:
//   S^T [64 tokens x 16 heads] = K [64 x 576] Q^T: 36 wgmma.m64n16k16, A = the chunk tile
//       (K-major, the tile as the 64-token kernels lay it out), B = q [16 heads][576] (K-major);
//   O^T [512 dims x 16 heads] += V^T [512 x 64 tokens] P^T: 8 m64 tiles x 4 k16 steps of
//       wgmma.m64n16k16, A = the same chunk tile read transposed (imm-trans-a: the 64 dims of one
//       token are one swizzled row, the MN-major layout), B = P [16 heads][64 tokens] bf16 in
//       shared memory (K-major).
// The tensor work per chunk is the 16 heads' own (4x less than a 64-row tile holding 16), and
// the bound becomes the operands' shared-memory reads: S reads the 72 KiB tile and 18 KiB of q,
// P V the 64 KiB of V once (~160 KiB at 128 B/clk: ~1250 clk, ~0.65 us a chunk against ~2 us).
//
// Roles (256 threads): warpgroup 0 computes (S, the softmax, P, P V, every chunk); warpgroup 1
// copies (the chunks' cp.async gathers and zero fills, an fp8 chunk's expansion in its tile,
// sparse_mla_tile64.cuh). Two chunk tiles in a ring; they meet at named barriers:
//   K_READY[b] (bar 3 + b): chunk k's copies into tile b = k % 2 have landed and are fenced for
//                       the async proxy (wg 1 arrives, wg 0 syncs before S);
//   K_FREE[b]  (bar 5 + b): wg 0's S and P V of chunk k are done (wg 0 arrives, wg 1 syncs
//                       before copying chunk k + 2 into the tile).
// Warpgroup 0 issues chunk k + 1's S right behind chunk k's P V (two accumulator sets for S),
// so the tensor pipe holds both; it waits for P V alone before it frees chunk k's tile.
// Each arrive has its sync under the same condition; a barrier is never arrived at again before
// its previous phase completed (K_READY of chunk k + 2 follows wg 1's K_FREE(k) sync, K_FREE of
// chunk k + 2 follows wg 0's K_READY(k + 2) sync). Warpgroup 0's own barrier (bar 1, 128
// threads) orders its column maxima and P through shared memory. Every slot of the CTA's chunks
// is staged (checked, int32) in the prologue, so no slot stage turns.
//
// The arithmetic of a head, which fixes its bits (the same for every batch, so batch-invariant):
//   s = a + b, a and b the chains of k16 steps over dims 0..287 and 288..575 (18 each, in k
//       order), scaled to log2 units, -inf where the slot is unused;
//   the chunk's max of head h: per warp the max over its 16 tokens (the thread's two, then the
//       xor-4, 8, 16 butterfly), then max over the four warps in order 0..3;
//   m_new = max(m, that), alpha = 2^(m - m_new) (m_new -inf: 0 used), p = 2^(s - m_new);
//   l: per thread l = l alpha + p(t) + p(t + 8) over its two tokens, chunk after chunk, summed at
//       the end over the xor-4, 8, 16 butterfly and then the warps in order 0..3;
//   O^T rescaled by alpha (skipped when every alpha of the warp is 1: o * 1 is o), then += V^T P^T
//       with P rounded to bf16, k16 steps 0..3 per accumulator, chunks ascending;
//   the split plan split_plan(topk, max_splits(), 64) and combine_slice's weights and sums
//       (sparse_mla_split.cuh, fixed split order), as every kernel; the partials reach the CTA
//       that sums a slice by remote stores (the end of the kernel), the values combine_splits
//       would have read.
// The heads per CTA are 16 always (the group the batch never moves); B only decides how many
// CTAs run.
//
// Shared memory (offsets from a 1024-aligned base): q 18 KiB (nine [16][64] tiles), two chunk
// tiles of 72 KiB, P^T 2 KiB, the column maxima [4][16] f32, the row sums [4][16] f32, the slots
// [chunks per split][64] int32 (8 KiB at one split), m [16], and what the other CTAs push: the
// partials' slices [splits][16][512 / splits] f32 (32 KiB) and their m and l [16][16] f32 each:
// 210 KiB at most. q's f32 rows come from L2 into the second tile before it takes chunk 1; after
// the loop the partial o [16][kPartPitch] f32 overlays q and the first tile.
// ptxas (sm_90a, nvcc 13.0): see the build's -Xptxas -v line for sparse_mla_hn_kernel.
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/pdl.h"
#include "backend/cuda/sparse_mla_load.cuh"
#include "backend/cuda/sparse_mla_split.cuh"
#include "backend/cuda/sparse_mla_tile64.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace sparse_mla_detail;
using sparse_mla_tile64::dequantize_tile;
using sparse_mla_tile64::fetch_chunk;
using sparse_mla_tile64::fetch_chunk_fp8;
using sparse_mla_tile64::kChunkBytes;
using sparse_mla_tile64::kPvSteps;
using sparse_mla_tile64::kRing;
using sparse_mla_tile64::kScoreSteps;
using sparse_mla_tile64::kTileBytes;
using sparse_mla_tile64::kTiles64;
using sparse_mla_tile64::kTokens;

constexpr int kHnHeads = 16;                              // the CTA's heads: every wgmma's N
constexpr int kHnThreads = 256;                           // two warpgroups
constexpr int kWgThreads = 128;                           // one warpgroup
constexpr int kQTileBytes = kHnHeads * kSwizzleRowBytes;  // [16 heads][64 dims]: 2 KiB
constexpr int kQBytes = kTiles64 * kQTileBytes;           // 18 KiB
constexpr int kOutTiles = kKvLoraRank / 64;               // 8 m64 tiles of O^T
constexpr int kPtBytes = kHnHeads * kSwizzleRowBytes;     // P [16 heads][64 tokens] bf16
constexpr int kMaxChunksPerCta = (2048 + kTokens - 1) / kTokens;  // one split of topk <= 2048
static_assert(kTokens == 64 && kPvSteps == 4 && kScoreSteps == 36);
static_assert(size_t(kHnHeads) * kLatentDim * 4 <= size_t(kChunkBytes), "q's f32 rows fit a tile");

enum Barrier : int { kSoftmax = 1, kKReady = 3, kKFree = 5 };
__device__ __forceinline__ void bar_wait(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kHnThreads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kHnThreads) : "memory");
}
__device__ __forceinline__ void bar_wg0() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(int(kSoftmax)), "n"(kWgThreads) : "memory");
}

struct SmemHn {
  size_t q, kv, pt, cmax, lsum, slots, m, recv, recv_m, recv_l, bytes;
};
constexpr SmemHn hn_layout() {
  SmemHn s{};
  s.q = 0;                                                  // 1024-aligned
  s.kv = s.q + kQBytes;                                     // 1024-aligned
  s.pt = s.kv + size_t(kRing) * kChunkBytes;                // 1024-aligned
  s.cmax = s.pt + kPtBytes;                                 // [4 warps][16] f32
  s.lsum = s.cmax + 4 * kHnHeads * 4;                       // [4 warps][16] f32
  s.slots = s.lsum + 4 * kHnHeads * 4;                      // [chunks][64] int32
  s.m = s.slots + size_t(kMaxChunksPerCta) * kTokens * 4;   // [16] f32
  s.recv = s.m + kHnHeads * 4;                              // [splits][16][512 / splits] f32
  s.recv_m = s.recv + size_t(kHnHeads) * kKvLoraRank * 4;   // [kMaxSplits][16] f32
  s.recv_l = s.recv_m + size_t(kMaxSplits) * kHnHeads * 4;  // [kMaxSplits][16] f32
  s.bytes = s.recv_l + size_t(kMaxSplits) * kHnHeads * 4 + kSwizzleAtomBytes;  // + align slack
  return s;
}

// What combine_slice needs of the kernel: 16 heads, combined by the first 128 threads (8 a head,
// so every split count up to 16 divides a CTA's slice).
struct HnVariant {
  static constexpr int kHeads = kHnHeads;
  static constexpr int kThreads = kWgThreads;  // the combine's threads (of the CTA's 256)
  static constexpr SmemHn kSmem = hn_layout();
  static_assert(kSmem.bytes <= kSmemLimit, "over the sm_90 dynamic shared memory limit");
  static_assert(size_t(kHeads) * kPartPitch * 4 <= kSmem.pt,
                "the partial o overlays q and the ring");
  static_assert(kSmem.kv % kSwizzleAtomBytes == 0 && kSmem.pt % kSwizzleAtomBytes == 0);
};

// The diagnostics trace: thread 0 (and 128, kLoop1) only (sparse_mla_split.cuh).
using Trace = SparseMlaTrace;

// S^T [64 tokens x 16 heads] over the 576 dims as two chains of 18 k16 steps, issued
// interleaved so the tensor pipe holds two independent accumulations: a over dims 0..287 (steps
// 0..17), b over dims 288..575 (steps 18..35), each in k order; S^T = a + b afterwards. Step i
// reads k16 block i % 4 of 64-dim tile i / 4 of the chunk (8 KiB tiles) and of q (2 KiB tiles).
constexpr int kChainSteps = kScoreSteps / 2;
template <int kI>
__device__ __forceinline__ void score_step(float (&s)[8], uint32_t tile, uint32_t q) {
  wgmma_bf16<16, 0>(s, wgmma_desc_sw128(tile + uint32_t((kI / 4) * kTileBytes + (kI % 4) * 32)),
                    wgmma_desc_sw128(q + uint32_t((kI / 4) * kQTileBytes + (kI % 4) * 32)));
}
template <int... kI>
__device__ __forceinline__ void scores_t(float (&a)[8], float (&b)[8], uint32_t tile, uint32_t q,
                                         std::integer_sequence<int, kI...>) {
  ((score_step<kI>(a, tile, q), score_step<kI + kChainSteps>(b, tile, q)), ...);
}

template <KvDtype D>
__global__ void __launch_bounds__(kHnThreads, 1)
    sparse_mla_hn_kernel(SparseMlaParams p, SplitPlan plan) {
  pdl_enter();
  using V = HnVariant;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = align_to_atom(smem_raw);  // the same pad in every CTA of the cluster
  const uint32_t base = smem_addr(smem);
  auto* slots_s = reinterpret_cast<int32_t*>(smem + V::kSmem.slots);
  auto* cmax_s = reinterpret_cast<float*>(smem + V::kSmem.cmax);  // [4 warps][16 heads]
  auto* lsum_s = reinterpret_cast<float*>(smem + V::kSmem.lsum);  // [4 warps][16 heads]
  auto slots_of = [&](int chunk) { return slots_s + chunk * kTokens; };
  auto tile_bytes = [&](int chunk) {
    return smem + V::kSmem.kv + size_t(chunk % kRing) * kChunkBytes;
  };
  auto tile_at = [&](int chunk) {
    return base + uint32_t(V::kSmem.kv + size_t(chunk % kRing) * kChunkBytes);
  };

  cg::cluster_group cluster = cg::this_cluster();
  const CtaWork work = cta_work(p, plan, kHnHeads, int(cluster.block_rank()), kTokens);
  const int chunk0 = work.chunk0, n_chunks = work.n_chunks;
  const int wg = int(threadIdx.x) / kWgThreads, t = int(threadIdx.x) % kWgThreads;
  const int warp = t / 32, lane = t % 32, g = lane / 4, qd = lane % 4;
  auto fetch = [&](int chunk) {
    if constexpr (D == KvDtype::kBf16) {
      fetch_chunk<kWgThreads>(p, slots_of(chunk), tile_bytes(chunk), t);
    } else {
      fetch_chunk_fp8<kWgThreads>(p, slots_of(chunk), tile_bytes(chunk), t);
    }
  };
  auto publish = [&](int chunk) {  // this thread's copies of the chunk have landed
    if constexpr (D == KvDtype::kFp8) dequantize_tile<kWgThreads>(tile_bytes(chunk), t);
    fence_proxy_async();
  };
  const bool tracing = p.trace != nullptr && threadIdx.x == 0;
  if (tracing) trace_begin(p);
  cluster_arrive_relaxed();  // this CTA has started: the others may store into its shared memory

  // Prologue. q's f32 rows into the second tile (cp.async where rows are 16-byte aligned), every
  // slot of the CTA's chunks loaded meanwhile and staged; then chunk 0's copies into the first
  // tile while q is rounded into its tile; then chunk 1's into the second.
  const float* q = p.q + int64_t(work.row) * p.ld_q + int64_t(work.head0) * kLatentDim;
  auto* q_stage = reinterpret_cast<float*>(smem + V::kSmem.kv + kChunkBytes);
  constexpr int kRowPieces = kLatentDim / 4;
  if (plan.q_from_l2) {
    for (int i = int(threadIdx.x); i < work.heads * kRowPieces; i += kHnThreads) {
      cp_async16(q_stage + i * 4, q + i * 4);  // head h's row at h * 576: contiguous
    }
  }
  cp_async_commit();
  for (int i = int(threadIdx.x); i < n_chunks * kTokens; i += kHnThreads) {
    slots_s[i] = int32_t(
        checked_slot(p, raw_slot(p, work.indices, chunk0 + i / kTokens, i % kTokens, kTokens)));
  }
  __syncthreads();  // the staged slots are visible
  if (wg == 1) {
    if (n_chunks > 0) fetch(0);
    cp_async_commit();
    cp_async_wait<1>();  // q's copies (chunk 0's may still fly)
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();  // q's f32 rows are visible
  const SwizzledRows<kHnHeads> q_at{smem + V::kSmem.q};
  for (int i = int(threadIdx.x); i < kHnHeads * kRowPieces; i += kHnThreads) {
    const int h = i / kRowPieces, d = i % kRowPieces * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // the rows past the CTA's heads: zero
    if (h < work.heads) {
      if (plan.q_from_l2) {
        v = *reinterpret_cast<const float4*>(q_stage + i * 4);
      } else {
        const float* src = q + int64_t(h) * kLatentDim + d;
        v = make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
      }
    }
    *reinterpret_cast<uint2*>(q_at(h, d)) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
  fence_proxy_async();  // q's stores -> this CTA's wgmma
  __syncthreads();      // q is complete; the second tile is free
  if (tracing) {
    trace_stamp(p, Trace::kQStored);
    trace_stamp(p, Trace::kPrologue);
  }

  // Warpgroup 0's S^T / O^T elements: tokens (dims) tok0 = 16 warp + g and tok0 + 8, heads
  // 8 j + 2 qd + e (j, e in {0, 1}: index 2 j + e of the thread's four heads).
  int head[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) head[k] = 8 * (k / 2) + 2 * qd + k % 2;
  const int tok0 = 16 * warp + g;
  float o[kOutTiles][8];
#pragma unroll
  for (int b = 0; b < kOutTiles; ++b) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[b][i] = 0.0f;
  }
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (wg == 0) {
    const uint32_t q_tile = base + uint32_t(V::kSmem.q), pt = base + uint32_t(V::kSmem.pt);
    const float scale_log2 = p.scale * 1.4426950408889634f;
    // S of a chunk into (sa, sb), committed as one group: chunk 0's before the loop, chunk
    // ch + 1's right behind chunk ch's P V, so the two overlap in the tensor pipe.
    float sa[8], sb[8];
    auto issue_scores = [&](int ch) {
      bar_wait(kKReady + ch % kRing);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        sa[i] = 0.0f, sb[i] = 0.0f;
        fence_operand(sa[i]);
        fence_operand(sb[i]);
      }
      wgmma_fence();
      scores_t(sa, sb, tile_at(ch), q_tile, std::make_integer_sequence<int, kChainSteps>{});
      wgmma_commit();
    };
    // One chunk: its softmax and P V, then (kNext) the next chunk's S. Every wgmma wait is
    // fixed at compile time (the last chunk is peeled), so no accumulator is in flight across
    // a branch that ptxas cannot see as uniform.
    auto chunk_step = [&](int ch, auto next) {
      constexpr bool kNext = decltype(next)::value;
      const uint32_t tile = tile_at(ch);
      wgmma_wait<0>();  // S of chunk ch (chunk ch - 1's P V was waited for before it was issued)
      float s[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        fence_operand(sa[i]);
        fence_operand(sb[i]);
        s[i] = sa[i] + sb[i];
      }

      // Mask and scale; s[4 j + 2 r + e] is token tok0 + 8 r, head index 2 j + e.
      const int32_t* slots = slots_of(ch);
      const bool ok[2] = {slots[tok0] >= 0, slots[tok0 + 8] >= 0};
      float cmax[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int j = k / 2, e = k % 2;
        float& a = s[4 * j + e];
        float& b = s[4 * j + 2 + e];
        a = ok[0] ? a * scale_log2 : -INFINITY;
        b = ok[1] ? b * scale_log2 : -INFINITY;
        cmax[k] = fmaxf(a, b);
        cmax[k] = fmaxf(cmax[k], __shfl_xor_sync(0xffffffffu, cmax[k], 4));
        cmax[k] = fmaxf(cmax[k], __shfl_xor_sync(0xffffffffu, cmax[k], 8));
        cmax[k] = fmaxf(cmax[k], __shfl_xor_sync(0xffffffffu, cmax[k], 16));
      }
      if (g == 0) {
#pragma unroll
        for (int k = 0; k < 4; ++k) cmax_s[warp * kHnHeads + head[k]] = cmax[k];
      }
      bar_wg0();  // every warp's maxima (and every thread is past P V of chunk ch - 1)
      float alpha[4];
      bool moved = false;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float c = cmax_s[head[k]];
#pragma unroll
        for (int w = 1; w < 4; ++w) c = fmaxf(c, cmax_s[w * kHnHeads + head[k]]);
        const float m_new = fmaxf(m[k], c);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing valid yet: p = 0
        alpha[k] = exp2f(m[k] - m_use);
        m[k] = m_new;
        const int j = k / 2, e = k % 2;
        const float p0 = exp2f(s[4 * j + e] - m_use), p1 = exp2f(s[4 * j + 2 + e] - m_use);
        s[4 * j + e] = p0, s[4 * j + 2 + e] = p1;
        l[k] = l[k] * alpha[k] + p0 + p1;
        moved = moved || alpha[k] != 1.0f;
      }
      // P [head][token] bf16, 128-byte swizzled K-major (tokens are P V's k): token t of head h
      // at byte swizzle128_offset(h, t / 8) + 2 (t % 8).
      uint8_t* pt_bytes = smem + V::kSmem.pt;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int j = k / 2, e = k % 2;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int tok = tok0 + 8 * r;
          *reinterpret_cast<__nv_bfloat16*>(pt_bytes + swizzle128_offset(head[k], tok / 8) +
                                            2 * (tok % 8)) =
              __float2bfloat16_rn(s[4 * j + 2 * r + e]);
        }
      }
      fence_proxy_async();  // P's stores -> the warpgroup's wgmma
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int b = 0; b < kOutTiles; ++b) {
#pragma unroll
          for (int i = 0; i < 8; ++i) o[b][i] *= alpha[2 * (i / 4) + i % 2];
        }
      }
#pragma unroll
      for (int b = 0; b < kOutTiles; ++b) {
#pragma unroll
        for (int i = 0; i < 8; ++i) fence_operand(o[b][i]);
      }
      bar_wg0();  // P is complete

      // O^T += V^T P^T: m64 tile b is dims [64 b, 64 b + 64), the chunk's 64-dim tile b read
      // transposed; k16 step kk is tokens [16 kk, 16 kk + 16): two swizzle atoms further in the
      // tile, 32 bytes further in P's rows.
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
        for (int b = 0; b < kOutTiles; ++b) {
          wgmma_bf16<16, 1>(
              o[b],
              wgmma_desc_sw128_mn(tile + uint32_t(b * kTileBytes + kk * 2 * kSwizzleAtomBytes),
                                  kTileBytes),
              wgmma_desc_sw128(pt + uint32_t(kk * 32)));
        }
      }
      wgmma_commit();
      if constexpr (kNext) {
        issue_scores(ch + 1);
        wgmma_wait<1>();  // P V of chunk ch (chunk ch + 1's S may still run)
      } else {
        wgmma_wait<0>();
      }
#pragma unroll
      for (int b = 0; b < kOutTiles; ++b) {
#pragma unroll
        for (int i = 0; i < 8; ++i) fence_operand(o[b][i]);
      }
      if (ch + 2 < n_chunks) bar_arrive(kKFree + ch % kRing);  // the tile may take chunk ch + 2
    };
    if (n_chunks > 0) {
      issue_scores(0);
      if (tracing) trace_stamp(p, Trace::kFirstS);
      for (int ch = 0; ch + 1 < n_chunks; ++ch) chunk_step(ch, std::true_type{});
      chunk_step(n_chunks - 1, std::false_type{});
    }
    if (tracing) trace_stamp(p, Trace::kLoop0);
  } else {
    if (n_chunks > 1) fetch(1);  // the second tile is free since q was rounded
    cp_async_commit();
    cp_async_wait<1>();  // chunk 0's copies (chunk 1's may still fly)
    if (n_chunks > 0) {
      publish(0);
      bar_arrive(kKReady + 0);
    }
    // Step ch: chunk ch + 1 announced once its copies have landed (K_READY; fp8: expanded, so
    // the expansion overlaps warpgroup 0's work on chunk ch), then chunk ch + 2 into chunk ch's
    // tile once warpgroup 0 is done with it (K_FREE). The order is warpgroup 0's: it waits for
    // chunk ch + 1 (its S goes behind chunk ch's P V) before it frees chunk ch's tile.
    for (int ch = 0; ch < n_chunks; ++ch) {
      if (ch + 1 < n_chunks) {
        cp_async_wait<0>();  // every group (chunk ch + 1's is the newest)
        publish(ch + 1);
        bar_arrive(kKReady + (ch + 1) % kRing);
      }
      if (ch + 2 < n_chunks) {
        bar_wait(kKFree + ch % kRing);
        fetch(ch + 2);
      }
      cp_async_commit();
    }
    cp_async_wait<0>();  // nothing in flight past here (the trailing groups are empty)
    if (p.trace != nullptr && t == 0) trace_stamp(p, Trace::kLoop1);
  }

  __syncthreads();  // every thread is done with q, the ring and P: the partial may overlay them
  if (wg == 0) {
    // l over the warp's tokens (the butterfly), then the warps in order 0..3 below.
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      l[k] += __shfl_xor_sync(0xffffffffu, l[k], 4);
      l[k] += __shfl_xor_sync(0xffffffffu, l[k], 8);
      l[k] += __shfl_xor_sync(0xffffffffu, l[k], 16);
    }
    // The split's partial: o unnormalized at part [head][dim], m and the warps' l sums.
    auto* part = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int b = 0; b < kOutTiles; ++b) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int dim = 64 * b + tok0 + 8 * ((i / 2) % 2);
        part[head[2 * (i / 4) + i % 2] * kPartPitch + dim] = o[b][i];
      }
    }
    if (g == 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        lsum_s[warp * kHnHeads + head[k]] = l[k];
        if (warp == 0) reinterpret_cast<float*>(smem + V::kSmem.m)[head[k]] = m[k];
      }
    }
  }
  __syncthreads();  // the partial, m and the warps' l sums are stored

  // The combine, pushed: each CTA stores the slices of its partial into the CTAs that own them
  // (recv [split][head][dim - d0] of split r's CTA for r's dims [d0, d0 + 512 / splits)), and its
  // m and l into every CTA's recv_m / recv_l [split][head]; after one cluster barrier each CTA
  // sums its own slice from its own shared memory. The remote stores never wait for a round
  // trip, nothing remote is read, and no CTA waits at the end for others to finish reading it.
  // The arithmetic is combine_slice's, on the same values: the bits do not depend on the path.
  const int splits = plan.splits, split = work.split, slice = kKvLoraRank / splits;
  auto* recv = reinterpret_cast<float*>(smem + V::kSmem.recv);
  auto* recv_m = reinterpret_cast<float*>(smem + V::kSmem.recv_m);
  auto* recv_l = reinterpret_cast<float*>(smem + V::kSmem.recv_l);
  auto in_cta = [&](float* local, int r) {
    return r == split ? local : cluster.map_shared_rank(local, r);
  };
  cluster_wait_acquire();  // the phase of the arrival at the start: every CTA has started
  if (threadIdx.x < kHnHeads) {
    const int h = int(threadIdx.x);
    const float l_h =
        ((lsum_s[h] + lsum_s[kHnHeads + h]) + lsum_s[2 * kHnHeads + h]) + lsum_s[3 * kHnHeads + h];
    const float m_h = reinterpret_cast<const float*>(smem + V::kSmem.m)[h];
    for (int r = 0; r < splits; ++r) {
      *in_cta(recv_m + split * kHnHeads + h, r) = m_h;
      *in_cta(recv_l + split * kHnHeads + h, r) = l_h;
    }
  }
  {
    const auto* part = reinterpret_cast<const float*>(smem);
    constexpr int kRowVecs = kKvLoraRank / 4;
    for (int i = int(threadIdx.x); i < work.heads * kRowVecs; i += kHnThreads) {
      const int h = i / kRowVecs, d = i % kRowVecs * 4;
      const float4 v = *reinterpret_cast<const float4*>(part + h * kPartPitch + d);
      *reinterpret_cast<float4*>(
          in_cta(recv + (split * kHnHeads + h) * slice + d % slice, d / slice)) = v;
    }
  }
  cluster_arrive_release();  // this CTA's pushes are done
  cluster_wait_acquire();    // every CTA's pushes are visible
  if (tracing) trace_stamp(p, Trace::kParts);
  const int d0 = split * slice;
  combine_slices<V>(
      p, splits, split, work.row, work.head0, work.heads,
      [&](int s, int h, int d) -> const float* {
        return recv + (s * kHnHeads + h) * slice + (d - d0);
      },
      [&](int s, int h, float& m_s, float& l_s) {
        m_s = recv_m[s * kHnHeads + h];
        l_s = recv_l[s * kHnHeads + h];
      });
  if (tracing) {
    trace_stamp(p, Trace::kCombined);
    trace_finish(p, n_chunks);
  }
}

}  // namespace

cudaError_t sparse_mla_hn(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.topk < 0) return cudaErrorInvalidValue;
  // Slots are staged as int32, and every slot of a CTA's chunks at once: a pool past 2^31 tokens,
  // or a topk past 2048 at one split, runs the wgmma kernel (a choice fixed by the pool and the
  // model's topk, never by the batch).
  SplitPlan plan = split_plan(p.topk, max_splits(), kTokens);
  if (p.pool.capacity() > INT32_MAX || plan.chunks_per_split > kMaxChunksPerCta) {
    return sparse_mla_wgmma(p, stream);
  }
  plan.heads_per_cta = kHnHeads;
  plan.q_from_l2 = q_rows_aligned(p);
  static LaunchOnce once_bf16, once_fp8;
  const bool fp8 = p.pool.dtype == KvDtype::kFp8;
  const SplitKernel kernel =
      fp8 ? sparse_mla_hn_kernel<KvDtype::kFp8> : sparse_mla_hn_kernel<KvDtype::kBf16>;
  return launch_split_clusters(kernel, p, plan, kHnHeads, kHnThreads, HnVariant::kSmem.bytes,
                               stream, fp8 ? once_fp8 : once_bf16);
}

}  // namespace dsa::cuda
