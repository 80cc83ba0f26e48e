// Absorbed sparse MLA decode (DESIGN §1.7), warp-specialized: the DSA_CUDA_SPARSE_MLA_VARIANT=ws
// kernel. The arithmetic of the 64-token kernel (sparse_mla_wgmma64.cu), term for term, with the
// work of a chunk split between the two warpgroups by role instead of by tokens, so that they
// stop waiting for each other at every step. bf16 latent caches, and fp8 ones expanded in the
// tiles (below). The default for both (sparse_mla.cu).
//
// Why: the 64-token kernel runs both warpgroups in lock step through three CTA barriers per
// chunk (S of 32 tokens each, the shared row max, the P exchange, P V of 256 dims each), with one
// CTA per SM: while the warpgroups do softmax or wait, the tensor cores idle, and the chunk's S
// runs as m64n32 (3 KiB of shared operands per 16 clocks of tensor work: above the 128 B/clk
// shared memory gives). Measured on the H200, a 64-token chunk takes ~4 us there against ~1.2 us
// of tensor work (216 us at B = 64: 168 TFLOP/s).
//
// Roles (warpgroup 0: "scores", warpgroup 1: "copies"):
//   wg 0: S [64 heads x 64 tokens] = Q K^T over 576 dims (36 wgmma.m64n64k16 in k order: 128
//         B/clk of shared operands, the tensor rate), the online softmax of the whole chunk, P
//         (bf16, the register-A fragments of P V) and the rows' rescale factors into shared
//         memory, then O[:, 0:256] += P V.
//   wg 1: every copy (the chunks' cp.async gathers and zero fills, the staged slots), then, per
//         chunk, P from shared memory and O[:, 256:512] += P V. Its P V of chunk k runs beside
//         warpgroup 0's S of chunk k + 1.
// The two meet at four named barriers (bar.arrive by the producer, bar.sync by the consumer) and
// two shared-memory barriers (mbarrier, 128 arrivals: every producer thread arrives, each
// releasing its own stores, and every consumer thread waits on the phase's parity):
//   K_READY[b] (bar 3 + b): chunk k's copies into tile b = k % 2 have landed and are fenced for
//                       the async proxy (wg 1 arrives, wg 0 waits before S);
//   p_full (mbarrier):  P and the factors of chunk k are in shared memory, and wg 0 is past the
//                       mask of chunk k (its last read of the chunk's slot stage); phase k;
//   p_empty (mbarrier): wg 1 has read P of chunk k (wg 0 waits before storing chunk k + 1's);
//                       phase k;
//   K_FREE[b] (bar 5 + b): wg 0's S and P V of chunk k are done (wg 1 waits before copying chunk
//                       k + 2 into the same tile; its own P V it waits for itself).
// Every arrive has its wait under the same condition, and a barrier is never arrived at again
// before its previous phase completed (each chain of a producer's second arrive passes through the
// consumer's wait of the first; see the loops), so no phase is left open at the cluster's combine.
// (The P handoff is on mbarriers because compute-sanitizer's racecheck reports every bar.arrive /
// bar.sync handoff of registers' data through shared memory as a RAW hazard; it models an
// mbarrier's per-thread release.)
//
// Batch invariance and bits. Every number that enters a head's sums is the 64-token kernel's, in
// its order: S per token (36 k16 steps in k order; wgmma is element-wise, N does not enter an
// element's sum), the mask, the chunk's row max max(max over tokens 0..31, max over 32..63),
// p = 2^(s - m), the two l sums (tokens 0..31 and 32..63, each l = l alpha + its 16 p in register
// order, added at the end: l_0 + l_1), o's rescale, P V (k16 steps 0..3 per accumulator, chunks
// ascending), the split plan (64-token chunks, split_plan(topk, max_splits(), 64)) and the
// combine (sparse_mla_split.cuh). So it gives the 64-token kernel's bits, which the parity tests
// check bitwise, and is batch-invariant for the same reasons.
//
// Heads per CTA: 16 or 32 where the launch then still fits one wave, else 64 (heads_per_cta,
// sparse_mla_split.cuh; DSA_CUDA_SPARSE_MLA_HEADS forces one): the tile keeps its 64 rows, the
// rows past the CTA's heads zero in q and never combined, so a CTA costs the same in its token
// loop and less in q's traffic and the combine. q comes from L2 into the ring before the first
// chunk (q_from_l2) or, with DSA_CUDA_SPARSE_MLA_Q=cluster (or rows not 16-byte aligned),
// through the cluster (share_queries). Neither choice moves a bit.
//
// fp8 caches (656 B a token: 512 e4m3, four f32 scales of 128 values, the rope as 64 bf16). q and
// the two bf16 tiles leave no room for a raw stage, so a chunk's raw bytes land inside its own
// tile, each token's in its own rows (sparse_mla_tile64.cuh: a 64-dim tile's e4m3 values in half
// of the token's row, the scales in its tile-0 row, the rope in its bf16 row), and warpgroup 1
// expands them in place (dequantize_tile: bf16(e4m3 * scale), the wgmma kernel's values; each
// warp the rows of the tokens it copied, with warp syncs only) between the copies' landing and
// K_READY, while its P V of the previous chunk runs on the tensor cores. From there on every
// number is the bf16 path's: the outputs are ws's on a bf16 cache holding the dequantized values,
// bit for bit (SparseMlaWsFp8MatchesDequantizedBf16Bitwise), so batch-invariant as it is.
// Napkin math per chunk: 42 KiB copied instead of 72, then 42 KiB read and 64 KiB written by the
// expansion (~800 instructions per thread of warpgroup 1, no bank conflicts): shared-memory
// traffic ~1.25x the bf16 chunk's, on the path from the copies to S of the next chunk.
//
// Shared memory (offsets from a 1024-aligned base): q 72 KiB and two chunk tiles of 72 KiB, as in
// the 64-token kernel; P [4 k16 steps][128 threads] uint4 (8 KiB); the factors alpha [64 heads]
// f32; slots [3][64] int32; m, l [64] f32; the two mbarriers: 231,952 of the 232,448 bytes.
// After the loop the partial o overlays q and the ring.
//
// Slot stages (chunk c in stage c % 3): the prologue stages chunks 0, 1, 2. wg 1 stages chunk
// k + 3 in its step k, after p_full(k) (wg 0 is past its mask of chunk k, the stage's last
// reader; the copies of chunk k read it in step k - 2) and before its K_READY(k + 1) arrive, which
// orders the write before wg 0's mask of chunk k + 3; its own copies of chunk k + 3 (step k + 1)
// come after its K_FREE(k + 1) wait, a bar.sync of every thread of wg 1 (the writers too).
//
// Napkin math (H200, per 64-token chunk and CTA): tensor work 72 wgmma-equivalents of m64n32k16
// for S (1152 clk at ~4 Kflop/clk) + 32 m64n64k16 for P V (1024 clk); shared memory: S 144 KiB,
// P V 64 KiB, copies 72 KiB, P 16 KiB: ~2300 clk. wg 0's chain (S, softmax ~300 clk, its P V)
// is ~2000 clk with wg 1's P V beside the next S: ~1.3 us per chunk, against ~4 us in the lock-step
// kernel. The copies of chunk k + 2 start once both P V of chunk k are done and must land before
// S of chunk k + 2: one chunk period (~1.3 us) for a 72 KiB gather.
// Measured (H200, bench/results/2026-12-04-h200-mla-ws.md): 21.8 / 194.7 / 725.5 us at B = 1 /
// 64 / 256 (8 splits) against the 64-token kernel's 24.2 / 212.1 / 820.3. The default since the
// evening of 2026-12-04 (racecheck clean once the combine lost its table of weights,
// sparse_mla_split.cuh). Far from the paper figure because of the split machinery: its phase trace
// (dsa_gpu_bench --mla-trace, bench/results/2026-12-04-h200-mla-splits.md) at 8 splits and B = 64
// gives a CTA's 21.6 us as q's broadcast 4.8 us, the token loop 7.4 (1.85 a chunk), the combine
// 8.8 (its pull alone 6.5, where moving the same bytes alone takes 4.7), so the default bound is 4
// splits (kDefaultSplits).
// ptxas (sm_90a, nvcc 13.0): 208 registers (bf16), 255 (fp8), no spills, no wgmma serialization
// warning.
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/pdl.h"
#include "backend/cuda/sparse_mla_load.cuh"
#include "backend/cuda/sparse_mla_split.cuh"
#include "backend/cuda/sparse_mla_tile64.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace sparse_mla_detail;
using namespace sparse_mla_tile64;

constexpr int kWgThreads = 128;                      // one warpgroup
constexpr int kHalfTokens = kTokens / 2;             // the two l sums' token halves
constexpr int kSRegs = kTokens / 2;                  // 32: m64n64 f32 per thread
constexpr int kPBytes = kPvSteps * kWgThreads * 16;  // [4 k16 steps][128 threads] uint4

// The named barriers (0 is __syncthreads); each joins the 256 threads of the CTA, but
// kSlotsStaged, warpgroup 1's own in the prologue (bar_wait_wg1).
enum Barrier : int { kKReady = 3, kKFree = 5, kSlotsStaged = 7 };
__device__ __forceinline__ void bar_wait(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreadsPerCta) : "memory");
}
__device__ __forceinline__ void bar_wait_wg1(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kWgThreads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreadsPerCta) : "memory");
}

// Offsets in bytes from the 1024-aligned base. combine_splits and finish_split read m, l, coef.
struct SmemWs {
  size_t q, kv, pfrag, alpha, slots, m, l, bars, coef, bytes;
};
constexpr SmemWs ws_layout() {
  SmemWs s{};
  s.q = 0;                                            // 1024-aligned
  s.kv = s.q + kQBytes;                               // 1024-aligned
  s.pfrag = s.kv + size_t(kRing) * kChunkBytes;       // 16-byte aligned
  s.alpha = s.pfrag + kPBytes;                        // [64] f32
  s.slots = s.alpha + kHeadsPerCta * 4;               // [3][64] int32
  s.m = s.slots + size_t(kSlotStages) * kTokens * 4;  // [64] f32
  s.l = s.m + kHeadsPerCta * 4;                       // [64] f32
  s.bars = s.l + kHeadsPerCta * 4;                    // p_full, p_empty: 8-byte aligned
  s.coef = kPartBytes;                                // [64][kMaxSplits] f32, overlaid
  s.bytes = s.bars + 2 * 8 + kSwizzleAtomBytes;       // + align slack
  return s;
}

struct WsVariant {
  static constexpr int kHeads = kHeadsPerCta;
  static_assert(size_t(kRing) * kChunkBytes == size_t(kHeadsPerCta) * kLatentDim * 4,
                "q's f32 rows fill the ring exactly (q from L2)");
  static constexpr int kThreads = kThreadsPerCta;
  static constexpr SmemWs kSmem = ws_layout();
  static_assert(kSmem.bytes <= kSmemLimit, "over the sm_90 dynamic shared memory limit");
  static_assert(kSmem.coef + size_t(kHeads) * kMaxSplits * 4 <= kSmem.pfrag,
                "the partial o and the coefficients overlay q and the ring only");
  static_assert(kSmem.kv % kSwizzleAtomBytes == 0 && kChunkBytes % kSwizzleAtomBytes == 0);
  static_assert(kSmem.bars % 8 == 0);
};

// The diagnostics trace: thread 0 (and 128, kLoop1) only (sparse_mla_split.cuh).
using Trace = SparseMlaTrace;

template <KvDtype D>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sparse_mla_ws_kernel(SparseMlaParams p, SplitPlan plan) {
  pdl_enter();
  using V = WsVariant;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The swizzle atoms need 1024-byte alignment. The pad is the same in every CTA of the cluster
  // (the same kernel), so mapped addresses agree.
  uint8_t* smem = align_to_atom(smem_raw);
  const uint32_t base = smem_addr(smem);

  auto* slots_s = reinterpret_cast<int32_t*>(smem + V::kSmem.slots);
  auto* pfrag = reinterpret_cast<uint4*>(smem + V::kSmem.pfrag);    // [4 kk][128 t]
  auto* alpha_s = reinterpret_cast<float*>(smem + V::kSmem.alpha);  // [64 heads]
  auto slots_of = [&](int chunk) { return slots_s + (chunk % kSlotStages) * kTokens; };
  auto tile_at = [&](int chunk) {
    return base + uint32_t(V::kSmem.kv + size_t(chunk % kRing) * kChunkBytes);
  };

  cg::cluster_group cluster = cg::this_cluster();
  // plan.heads_per_cta heads (16, 32 or 64) in the tile's first rows; the rest of its 64 rows
  // stay zero in q and are never combined.
  const CtaWork work = cta_work(p, plan, plan.heads_per_cta, int(cluster.block_rank()), kTokens);
  const int chunk0 = work.chunk0, n_chunks = work.n_chunks;
  const int wg = int(threadIdx.x) / kWgThreads, t = int(threadIdx.x) % kWgThreads;
  const int warp = t / 32, lane = t % 32, g = lane / 4, qd = lane % 4;
  const int row0 = 16 * warp + g;  // this thread's heads: row0 and row0 + 8 (both warpgroups)
  auto tile_bytes = [&](int chunk) {
    return smem + V::kSmem.kv + size_t(chunk % kRing) * kChunkBytes;
  };
  auto fetch = [&](int chunk) {
    if constexpr (D == KvDtype::kBf16) {
      fetch_chunk<kWgThreads>(p, slots_of(chunk), tile_bytes(chunk), t);
    } else {
      fetch_chunk_fp8<kWgThreads>(p, slots_of(chunk), tile_bytes(chunk), t);
    }
  };
  // Warpgroup 1, once this thread's copies of the chunk have landed: an fp8 chunk is expanded to
  // bf16 in its tile (each warp its own tokens' rows), then this thread's stores are fenced for
  // the async proxy; the caller then announces the chunk (K_READY).
  auto publish = [&](int chunk) {
    if constexpr (D == KvDtype::kFp8) dequantize_tile<kWgThreads>(tile_bytes(chunk), t);
    fence_proxy_async();
  };

  // Prologue, the two warpgroups side by side: warpgroup 1 loads and stages the slots of chunks
  // 0..2 and issues chunks 0 and 1's copies (one group each) while warpgroup 0 brings this CTA's
  // share of q into every CTA of the cluster, so the first gather's latency overlaps q's round
  // trip. Both keep the cluster barrier's two phases (started; q stored), which every thread of
  // every CTA arrives at.
  auto* p_full = reinterpret_cast<uint64_t*>(smem + V::kSmem.bars);
  uint64_t* p_empty = p_full + 1;
  if (threadIdx.x == 0) {  // visible to every thread after the prologue's last barrier
    mbar_init(p_full, kWgThreads);
    mbar_init(p_empty, kWgThreads);
    mbar_init_fence();
  }
  const bool tracing = p.trace != nullptr && threadIdx.x == 0;
  if (tracing) trace_begin(p);
  // Warpgroup 1 loads the slots of chunks 0..2 and stages them (checked) for every thread.
  auto stage_first_slots = [&] {
    int64_t first[kSlotStages];
#pragma unroll
    for (int i = 0; i < kSlotStages; ++i) {
      first[i] = t < kTokens && i < n_chunks ? raw_slot(p, work.indices, chunk0 + i, t, kTokens)
                                             : int64_t(-1);
    }
    if (t < kTokens) {
#pragma unroll
      for (int i = 0; i < kSlotStages; ++i) slots_of(i)[t] = int32_t(checked_slot(p, first[i]));
    }
  };
  if (plan.q_from_l2) {
    // q from L2, no cluster traffic: every thread copies its share of the CTA's heads' f32 rows
    // into the ring (64 x 576 f32 is both tiles; the launcher checked 16-byte alignment), warpgroup
    // 1 stages the slots meanwhile; then the rows are rounded to bf16 into q's tile (the rows past
    // the CTA's heads zero: the same values as share_queries stores), and only then do chunks 0
    // and 1 take the ring.
    auto* stage = reinterpret_cast<float*>(smem + V::kSmem.kv);
    const float* q = p.q + int64_t(work.row) * p.ld_q + int64_t(work.head0) * kLatentDim;
    constexpr int kRowPieces = kLatentDim / 4;
    for (int i = int(threadIdx.x); i < work.heads * kRowPieces; i += kThreadsPerCta) {
      cp_async16(stage + i * 4, q + i * 4);  // rows are contiguous: head h at h * 576
    }
    cp_async_commit();
    if (wg == 1) stage_first_slots();
    cp_async_wait<0>();
    __syncthreads();  // q's f32 rows and the staged slots are visible
    const SwizzledRows<kHeadsPerCta> q_at{smem + V::kSmem.q};
    for (int i = int(threadIdx.x); i < kHeadsPerCta * kRowPieces; i += kThreadsPerCta) {
      const int h = i / kRowPieces, d = i % kRowPieces * 4;
      const float4 v = h < work.heads ? *reinterpret_cast<const float4*>(stage + i * 4)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      *reinterpret_cast<uint2*>(q_at(h, d)) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
    fence_proxy_async();  // q's stores -> this CTA's wgmma
    __syncthreads();      // q is complete; the ring is free
    if (tracing) trace_stamp(p, Trace::kQStored);
    if (wg == 1) {
      if (n_chunks > 0) fetch(0);
      cp_async_commit();
      if (n_chunks > 1) fetch(1);
      cp_async_commit();
    }
  } else {
    cluster_arrive_relaxed();  // this CTA has started: the others may write its q
    if (wg == 1) {
      stage_first_slots();
      bar_wait_wg1(kSlotsStaged);  // warpgroup 1 alone: the staged slots are visible to it
      if (n_chunks > 0) fetch(0);
      cp_async_commit();
      if (n_chunks > 1) fetch(1);
      cp_async_commit();
      cluster_wait_acquire();    // the first phase (every CTA has started)
      cluster_arrive_release();  // this warpgroup stores no q
    } else {
      share_queries<V::kHeads, kWgThreads>(p, cluster, plan.splits, work.split, work.row,
                                           work.head0, work.heads,
                                           SwizzledRows<kHeadsPerCta>{smem + V::kSmem.q});
      fence_proxy_async_all();   // q's stores, in any CTA
      cluster_arrive_release();  // this CTA's q stores are done
      if (tracing) trace_stamp(p, Trace::kQStored);
    }
    cluster_wait_acquire();  // q is complete in every CTA of the cluster
    fence_proxy_async();     // ... and visible to this thread's wgmma (reader side)
  }
  if (tracing) trace_stamp(p, Trace::kPrologue);

  float o[kOutTiles][32];
  zero_accumulators(o);
  auto fence_o = [&] { fence_accumulators(o); };
  auto o_flat = [&]() -> float(&)[kOutTiles * 32] {
    return reinterpret_cast<float(&)[kOutTiles * 32]>(o);
  };
  // Rows row0, row0 + 8, log2 units. l: tokens 0..31 of every chunk (l) and 32..63 (l_hi), as
  // the 64-token kernel's warpgroups 0 and 1 keep them; warpgroup 0's alone are used.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  auto fence_a = [](uint32_t(&a)[kPvSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) fence_operand(a[kk][r]);
    }
  };

  if (wg == 0) {
    const uint64_t desc_q = wgmma_desc_sw128(base + uint32_t(V::kSmem.q));
    const float scale_log2 = p.scale * 1.4426950408889634f;
    float m_hi[2] = {-INFINITY, -INFINITY}, l_hi[2] = {0.0f, 0.0f};
    for (int ch = 0; ch < n_chunks; ++ch) {
      // S of the chunk once its copies have landed (K_READY).
      bar_wait(kKReady + ch % kRing);
      if (tracing && ch == 0) trace_stamp(p, Trace::kFirstS);
      const uint32_t tile = tile_at(ch);
      float s[kSRegs];
#pragma unroll
      for (int i = 0; i < kSRegs; ++i) {
        s[i] = 0.0f;
        fence_operand(s[i]);
      }
      wgmma_fence();
      scores<kTokens>(s, desc_q, wgmma_desc_sw128(tile),
                      std::make_integer_sequence<int, kScoreSteps>{});
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kSRegs; ++i) fence_operand(s[i]);

      // The softmax step on the two token halves (the D fragment's registers 0..15 are tokens
      // 0..31, 16..31 are 32..63), with the chunk's max of both; the same m and alpha in both
      // halves' updates.
      float lo[16], hi[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) lo[i] = s[i], hi[i] = s[16 + i];
      float cmax[2], cmax_hi[2];
      mask_scores(lo, slots_of(ch), qd, scale_log2, cmax);
      mask_scores(hi, slots_of(ch) + kHalfTokens, qd, scale_log2, cmax_hi);
#pragma unroll
      for (int r = 0; r < 2; ++r) cmax[r] = fmaxf(cmax[r], cmax_hi[r]);
      float alpha[2], alpha_hi[2];
      const bool rescale = update_softmax(lo, cmax, m, l, alpha);
      update_softmax(hi, cmax, m_hi, l_hi, alpha_hi);

      // P as register-A fragments (k16 step kk: tokens [16 kk, 16 kk + 16)), stored for
      // warpgroup 1 once it has read the previous chunk's (p_empty), with the factors.
      uint32_t a[kPvSteps][4];
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float* half = kk < 2 ? lo : hi;
          a[kk][r] = pack_bf16(half[8 * (kk % 2) + 2 * r], half[8 * (kk % 2) + 2 * r + 1]);
        }
      }
      if (ch > 0) mbar_wait(p_empty, uint32_t(ch - 1) & 1u);
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
        pfrag[kk * kWgThreads + t] = make_uint4(a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
      }
      if (qd == 0) {
        alpha_s[row0] = alpha[0];
        alpha_s[row0 + 8] = alpha[1];
      }
      mbar_arrive(p_full);
      fence_a(a);
      if (rescale) rescale_rows(o_flat(), alpha);
      fence_o();

      // O[:, 0:256] += P V, waited here (no group pending across the back edge: C7515).
      issue_pv_group<kPvSteps, kOutTiles, kTileBytes>(o, a, tile, 0);
      wgmma_wait<0>();
      fence_o();
      fence_a(a);
      if (ch + 2 < n_chunks) bar_arrive(kKFree + ch % kRing);  // the tile may take chunk ch + 2
    }
    // l = l_0 + l_1 thread by thread, as the 64-token kernel adds its warpgroups' sums.
    if (tracing) trace_stamp(p, Trace::kLoop0);
    l[0] += l_hi[0];
    l[1] += l_hi[1];
  } else {
    cp_async_wait<1>();  // chunk 0's copies (chunk 1's may still fly)
    if (n_chunks > 0) {  // the same in every thread of the CTA
      publish(0);        // this thread's copies and zero fills (fp8: the bf16 rows) -> wgmma
      bar_arrive(kKReady + 0);
    }
    for (int ch = 0; ch < n_chunks; ++ch) {
      const bool restage = t < kTokens && ch + 3 < n_chunks;
      const int64_t next_slot =
          restage ? raw_slot(p, work.indices, chunk0 + ch + 3, t, kTokens) : int64_t(-1);
      // P of the chunk and its factors, then its stage is free for chunk ch + 3's slots.
      mbar_wait(p_full, uint32_t(ch) & 1u);
      uint32_t a[kPvSteps][4];
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
        const uint4 v = pfrag[kk * kWgThreads + t];
        a[kk][0] = v.x, a[kk][1] = v.y, a[kk][2] = v.z, a[kk][3] = v.w;
      }
      const float alpha[2] = {alpha_s[row0], alpha_s[row0 + 8]};
      if (ch + 1 < n_chunks) mbar_arrive(p_empty);
      if (restage) slots_of(ch + 3)[t] = int32_t(checked_slot(p, next_slot));
      fence_a(a);
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
        rescale_rows(o_flat(), alpha);
      }
      fence_o();

      // O[:, 256:512] += P V; while it runs, chunk ch + 1's copies are waited for and announced.
      const uint32_t tile = tile_at(ch);
      issue_pv_group<kPvSteps, kOutTiles, kTileBytes>(o, a, tile, 1);
      if (ch + 1 < n_chunks) {
        cp_async_wait<0>();  // chunk ch + 1's copies: the only group in flight
        publish(ch + 1);
        bar_arrive(kKReady + (ch + 1) % kRing);
      }
      wgmma_wait<0>();
      fence_o();
      fence_a(a);
      // Chunk ch + 2 into this tile once warpgroup 0 is done with it too (K_FREE).
      if (ch + 2 < n_chunks) {
        bar_wait(kKFree + ch % kRing);
        fetch(ch + 2);
      }
      cp_async_commit();
    }
    cp_async_wait<0>();  // nothing in flight past here (the trailing groups are empty)
    if (p.trace != nullptr && t == 0) trace_stamp(p, Trace::kLoop1);
  }

  // The combine (finish_split syncs the CTA before the partial overlays q and the ring; p_full and
  // p_empty, outside that overlay, are left as they are).
  finish_split<V>(p, cluster, plan, work, smem, reinterpret_cast<const float(&)[128]>(o), m, l,
                  row0, wg * (kKvLoraRank / 2) + 2 * qd, wg == 0 && qd == 0, [&](int word) {
                    if (tracing) trace_stamp(p, word);
                  });
  if (tracing) trace_finish(p, n_chunks);
}

// Where a CTA's q comes from: the cluster (each CTA loads 1/splits of it and stores it into every
// CTA: q's traffic crosses L2 once per head group and the SM-to-SM network splits - 1 times) or
// L2 (each CTA copies its own heads' f32 rows with cp.async into the ring before the first chunk:
// splits times the L2 reads, no network traffic and no cluster barrier in the prologue). L2 by
// default where q's rows are 16-byte aligned (the model's always are); DSA_CUDA_SPARSE_MLA_Q=
// cluster forces the cluster, =l2 asks for L2 (read at every call). L2 is faster at every batch
// measured: 30.9 / 159.1 / 540.3 us at B = 1 / 64 / 256 against the cluster's 32.2 / 168.9 /
// 571.4 (bf16, 4 splits, one process on an H100, bench/results/2026-12-05-h100-mla.md); at 4
// splits and B = 64 the cluster's way took 6.3 of a CTA's 31.3 us on the H200
// (bench/results/2026-12-04-h200-mla-splits.md, run 7), its loads and the network pushing about
// 9 B per SM clock. Either way q is rounded to bf16 the same way: the same bits.
bool q_from_l2(const SparseMlaParams& p) {
  const bool aligned = q_rows_aligned(p);
  const char* v = std::getenv("DSA_CUDA_SPARSE_MLA_Q");
  if (v != nullptr && std::strcmp(v, "cluster") == 0) return false;
  return aligned;
}

}  // namespace

cudaError_t sparse_mla_ws(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.topk < 0) return cudaErrorInvalidValue;
  // Slots are staged as int32: a pool past 2^31 tokens runs the wgmma kernel, a choice fixed by the
  // pool, never by the batch.
  if (p.pool.capacity() > INT32_MAX) return sparse_mla_wgmma(p, stream);
  SplitPlan plan = split_plan(p.topk, max_splits(), kTokens);
  plan.q_from_l2 = q_from_l2(p);
  static LaunchOnce once_bf16, once_fp8;
  const bool fp8 = p.pool.dtype == KvDtype::kFp8;
  LaunchOnce& once = fp8 ? once_fp8 : once_bf16;
  const SplitKernel kernel =
      fp8 ? sparse_mla_ws_kernel<KvDtype::kFp8> : sparse_mla_ws_kernel<KvDtype::kBf16>;
  constexpr size_t kSmemBytes = WsVariant::kSmem.bytes;
  plan.heads_per_cta = heads_per_cta(
      p, plan, [&] { return wave_ctas(kernel, plan.splits, kThreadsPerCta, kSmemBytes, once); });
  return launch_split_clusters(kernel, p, plan, plan.heads_per_cta, kThreadsPerCta, kSmemBytes,
                               stream, once);
}

}  // namespace dsa::cuda
