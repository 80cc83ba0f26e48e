// Absorbed sparse MLA decode (DESIGN §1.7) on Hopper warpgroup MMA (wgmma, sm_90a), 64 selected
// tokens per step and S split by tokens: the DSA_CUDA_SPARSE_MLA_VARIANT=wgmma64 kernel, bf16
// latent caches only (fp8 caches under this variant run the wgmma kernel,
// sparse_mla_wgmma.cu). The split plan (chunks of 64 here), the cluster's q distribution
// (start_split / share_queries) and its fixed-order combine (finish_split / combine_splits) are
// the other kernels' (sparse_mla_load.cuh, sparse_mla_split.cuh). FlashMLA's sparse decode is the
// model for the step.
//
// Why: the wgmma kernel's step (32 tokens, S split over the 576 dims between the warpgroups and
// summed through 16 KiB of f32 in shared memory, both warpgroups redoing one softmax) measures
// ~3 us against ~1 us of tensor and shared-memory work: a serial chain of waits and barriers with
// one CTA per SM and nothing to hide its latency. Here a step carries twice the tokens through
// one such chain, and the chain is shorter: no f32 exchange of S, no redundant softmax.
//
// Launch: rows * G * S CTAs of 256 threads (two warpgroups) in clusters of S, G = ceil(heads /
// 64), S = split_plan(topk, max_splits(), 64).splits (topk and the process-wide bound alone:
// top-2048 is 32 chunks, 8 splits of 4). CTA x is split x % S of head group (x / S) % G of row
// x / (S G); it walks the chunks [s cps, (s + 1) cps) of the row's selected tokens and keeps an
// unnormalized partial (m, l, o) for its 64 heads; the cluster combines the partials in the order
// 0, 1, ..., S - 1.
//
// Shared memory (offsets from a 1024-aligned base):
//   q     [9 tiles][64 heads][64 dims] bf16, 128-byte swizzled K-major (wgmma.cuh): 72 KiB,
//         filled once by the cluster and fenced to the async proxy.
//   kv    a ring of 2 chunk tiles [9][64 tokens][64 dims], swizzled the same way (72 KiB each),
//         filled by cp.async straight from the cache rows (a token's 1152 bytes are its 9 tile
//         rows); unused tokens' rows are zero-filled, never read from the pool.
//   pex   the P exchange, [2 warpgroups][2 k16 steps][128 threads] of 4 packed bf16 pairs: 8 KiB.
//   rmax  the row-max exchange, [2 warpgroups][64 heads] f32.
//   slots [3][64] int32 (the host runs this kernel only when the pool's capacity fits: any pool
//         an H200 holds), m [64], l [64] f32.
//   221,184 + 8,192 + 512 + 768 + 512 = 231,168 bytes, + 1 KiB of alignment slack = 232,192 of
//   the 232,448 allowed: one CTA per SM. A third chunk tile would need 72 KiB more, so the ring
//   is two chunks (one landing while one is computed). After the loop the partial o [64][520]
//   f32 (133,120 bytes) and the combine's coefficients [64][16] f32 overlay q and the dead ring.
//
// One chunk (k = the chunk, warpgroup w in {0, 1}, thread t in [0, 128) of it):
//   1. wait for this thread's copies of chunk k (cp.async.wait_group 0), fence.proxy.async,
//      __syncthreads (barrier 1: chunk k is visible to both proxies, and both warpgroups are past
//      the P V of chunk k - 1, so its tile is free).
//   2. issue the copies of chunk k + 1 into that tile (one cp.async group; empty past the end),
//      load the raw slots of chunk k + 2.
//   3. S_w [64 heads x 32 tokens] = Q K^T for the tokens [32 w, 32 w + 32) of the chunk over all
//      576 dims: 36 wgmma.m64n32k16 in k order (A = the q tile, B = rows 32 w.. of the chunk
//      tile, both K-major in shared memory; both 64-dim tiles are 8 KiB, so step i reads both at
//      the same offset (i / 4) 8 KiB + (i % 4) 32 B from two base descriptors); wait.
//   4. Scale to log2 units, mask the tokens whose slot is -1 (negative or past the pool: never
//      read, their rows are zeros) to -inf, the row max over the quad; the two warpgroups'
//      maxima of the 64 rows meet in rmax (__syncthreads, barrier 2). Both take m_new =
//      max(m_old, max(rmax_0, rmax_1)) from the same shared floats in the same order: the same
//      bits, so the same alpha = 2^(m_old - m_new) in both. Each keeps l_w over its own tokens.
//   5. p = 2^(s - m_new), packed to bf16 straight from the D fragment of S as the register-A
//      operand of P V (wgmma.cuh: two 8-column blocks of D are one k16 A fragment). Each thread
//      stores its two fragments (2 x 16 bytes) in pex; __syncthreads (barrier 3); it loads those
//      of the same thread t of the other warpgroup, which holds the same rows (the same warp
//      within its warpgroup, the same lane) of the other 32 tokens: exactly the A fragments of
//      those k16 steps. o is rescaled by alpha unless no row max of the warp moved.
//   6. O_w [64 heads x dims [256 w, 256 w + 256)] += P [64 x 64 tokens] V: 4 k16 steps (tokens
//      ascending: the fragments of warpgroup 0, then 1, in both) x 4 wgmma.m64n64k16 (one per
//      64-dim tile 4 w + nb, B = the chunk tile read MN-major: a tile row is a token, a k row of
//      V), register A; committed and waited.
//   7. stage the checked slots of chunk k + 2.
// Per chunk: 72 + 32 wgmma, 3 CTA barriers, 8 KiB of P and 512 bytes of maxima through shared
// memory, one cp.async group.
// Every group is waited inside its step: none is pending across the loop's back edge (ptxas
// serializes every wgmma then, C7515).
//
// Ring invariants (k = the chunk whose step it is):
//   - tiles: chunk c lives in tile c % 2. The copies of chunk k + 1 go to tile (k + 1) % 2 after
//     barrier 1 of step k, which every thread passes only after waiting for its S and P V of
//     chunk k - 1 (the tile's last readers; wgmma reads complete at wgmma.wait_group). So chunk
//     k + 1 lands while chunk k is computed, and barrier 1 of step k + 1 waits for all of a
//     thread's groups (its copies of chunk k + 1: the only group in flight).
//   - rmax: written before barrier 2 of step k, read between barriers 2 and 3 of step k, written
//     again before barrier 2 of step k + 1, by threads past barrier 3 of step k.
//   - pex: written before barrier 3 of step k, read after it (before barrier 1 of step k + 1),
//     written again after barrier 1 of step k + 1.
//   - slots: 3 stages, chunk c in stage c % 3. The prologue stages chunks 0 and 1; step k stages
//     chunk k + 2 at its end, over chunk k - 1's stage, whose last readers (the copies of chunk
//     k - 1 at step k - 2, the mask of step k - 1) every thread passed before barrier 1 of step
//     k; its readers (the copies at step k + 1, the mask at step k + 2) come after barrier 1 of
//     step k + 1.
//   - after the loop: a barrier (every thread past its last pex read), warpgroup 1 leaves its
//     per-thread l in pex, a barrier, warpgroup 0 adds it to its own (l_0 + l_1, thread by
//     thread, then the quad sum in finish_split: a fixed order), then finish_split's barrier
//     before the partial o overwrites q and the ring.
//
// Batch invariance. Every number that enters a head's arithmetic is fixed by (heads, topk, the
// split bound): the chunk of 64, the split boundaries, which warpgroup computes which tokens'
// S (36 steps in k order), the shared row max, the P V order (k16 steps 0..3 per accumulator,
// chunks ascending), the l order, the combine order. The batch only decides the grid size.
// wgmma is defined element-wise, so other heads, tokens or rows never meet a head's sums. The
// bits differ from the wgmma kernel's (a 576-dim chain instead of two 288-dim halves summed, and
// the running max moves per 64 tokens instead of 32): the variant is chosen per process.
//
// Proxy fences. q's stores (local and remote, generic proxy) are followed by fence.proxy.async
// in the writing thread before the cluster barrier's release and by fence.proxy.async.shared::cta
// in every reader after the acquire (start_split, as in the wgmma kernel); the chunk copies and
// zero fills by the writer's fence after its cp.async wait, then barrier 1. pex, rmax, slots, m,
// l and the partial o are generic-only (P reaches wgmma through registers).
//
// Napkin math (H200: 132 SMs, ~1.8 GHz, 128 B/clk of shared memory and ~4 Kflop/clk of dense
// bf16 per SM; V3.2: 128 heads, topk 2048, 8 splits of 4 chunks of 64):
//   Per chunk and CTA: 72 wgmma.m64n32k16 (S) + 32 wgmma.m64n64k16 (P V) = 2 x 64 x 64 x (576 +
//   512) = 8.9 Mflop = ~2180 clk of tensor work. Shared memory: S operands 72 x (2 KiB of q +
//   1 KiB of kv) = 216 KiB, V 32 x 2 KiB = 64 KiB, P 8 KiB stored + 8 KiB loaded, copies in
//   72 KiB: ~368 KiB = ~2950 clk. (The wgmma kernel, per 32 tokens: ~208 KiB, 32 of them the
//   f32 exchange of S, and ~1090 clk of tensor work; its softmax runs twice.)
//   Serial inside a CTA: S ~1730 clk (its operand reads: 3 KiB per 16 clk of tensor work is
//   more than 128 B/clk), softmax + 2 exchanges + 3 barriers ~400, P V ~1020 (tensor-bound):
//   ~3150 clk, ~1.75 us per 64 tokens, where the wgmma kernel's two 32-token steps are ~3.8k
//   clk on paper and ~6 us measured.
//   B = 1: 2 x 8 = 16 CTAs, each 4 chunks in a row: ~7 us + ~2 us prologue (q, the first
//     chunk's copies) + ~1 us combine ~ 10 us; target <= 12 us. If each step keeps the ~2 us of
//     latency the wgmma kernel's steps measure beyond their paper figure, ~18 us.
//   B = 64: 64 x 2 x 8 = 1024 CTAs; clusters of 8 place 128 at a time: 8 waves x (4 chunks ~7 us
//     + prologue and combine ~3 us) ~ 80 us (~450 TFLOP/s); with ~2 us of latency per step,
//     ~144 us (~250 TFLOP/s). Target >= 250 TFLOP/s (<= 146 us).
//   B = 256: 32 such waves, ~320 us (~450 TFLOP/s); ~580 us with the latency.
// Why no overlapped schedule (the step of chunk k + 1 issuing its S beside the P V of chunk k,
// as the wgmma kernel's does): with two tiles, the copies of chunk k + 2 (into the tile of chunk
// k) could then start only once that P V has completed, at the end of the step, right before
// they are needed: the latency the overlap would hide comes back as a copy wait. It needs a
// third tile (72 KiB more than fits).
// ptxas (sm_90a, nvcc 13.0, -Xptxas -v): 195 registers per thread, no spills, no wgmma
// serialization warning (C7513, C7515); 256 threads, one CTA per SM (by shared memory).
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>
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
using namespace sparse_mla_tile64;

constexpr int kWgTokens = kTokens / 2;       // 32: S's N per warpgroup
constexpr int kSRegs = kWgTokens / 2;        // 16: m64n32 f32 per thread
constexpr int kPexBytes = 2 * 2 * 128 * 16;  // [wg][2 k16 steps][128 threads] uint4

// Offsets in bytes from the 1024-aligned base. combine_splits and finish_split read m, l, coef.
struct Smem64 {
  size_t q, kv, pex, rmax, slots, m, l, coef, bytes;
};
constexpr Smem64 wg64_layout() {
  Smem64 s{};
  s.q = 0;                                               // 1024-aligned
  s.kv = s.q + kQBytes;                                  // 1024-aligned
  s.pex = s.kv + size_t(kRing) * kChunkBytes;            // 16-byte aligned
  s.rmax = s.pex + kPexBytes;                            // [2][64] f32
  s.slots = s.rmax + 2 * kHeadsPerCta * 4;               // [3][64] int32
  s.m = s.slots + size_t(kSlotStages) * kTokens * 4;     // [64] f32
  s.l = s.m + kHeadsPerCta * 4;                          // [64] f32
  s.coef = kPartBytes;                                   // [64][kMaxSplits] f32, overlaid
  s.bytes = s.l + kHeadsPerCta * 4 + kSwizzleAtomBytes;  // + align slack
  return s;
}

struct Wg64Variant {
  static constexpr int kHeads = kHeadsPerCta;
  static constexpr int kThreads = kThreadsPerCta;
  static constexpr Smem64 kSmem = wg64_layout();
  static_assert(kSmem.bytes <= kSmemLimit, "over the sm_90 dynamic shared memory limit");
  static_assert(kSmem.coef + size_t(kHeads) * kMaxSplits * 4 <= kSmem.pex,
                "the partial o and the coefficients overlay q and the ring only");
  static_assert(kSmem.kv % kSwizzleAtomBytes == 0 && kChunkBytes % kSwizzleAtomBytes == 0);
  static_assert(size_t(2) * 128 * 4 <= kPexBytes, "the l exchange lives in pex");
};

__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sparse_mla_wgmma64_kernel(SparseMlaParams p, SplitPlan plan) {
  pdl_enter();
  using V = Wg64Variant;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The swizzle atoms need 1024-byte alignment. The pad is the same in every CTA of the cluster
  // (the same kernel), so mapped addresses agree.
  uint8_t* smem = align_to_atom(smem_raw);
  const uint32_t base = smem_addr(smem);

  auto* slots_s = reinterpret_cast<int32_t*>(smem + V::kSmem.slots);
  auto* rmax = reinterpret_cast<float*>(smem + V::kSmem.rmax);  // [2 wg][64 heads]
  auto* pex = reinterpret_cast<uint4*>(smem + V::kSmem.pex);    // [2 wg][2 kk][128 t]
  auto slots_of = [&](int chunk) { return slots_s + (chunk % kSlotStages) * kTokens; };
  auto tile_offset = [&](int chunk) {
    return uint32_t(V::kSmem.kv + size_t(chunk % kRing) * kChunkBytes);
  };
  auto fetch = [&](int chunk) {
    fetch_chunk<kThreadsPerCta>(p, slots_of(chunk), smem + tile_offset(chunk), int(threadIdx.x));
  };

  cg::cluster_group cluster = cg::this_cluster();
  const CtaWork work = cta_work(p, plan, V::kHeads, int(cluster.block_rank()), kTokens);
  const int chunk0 = work.chunk0, n_chunks = work.n_chunks;
  const int wg = int(threadIdx.x) / 128, t = int(threadIdx.x) % 128;
  const int warp = t / 32, lane = t % 32, g = lane / 4, qd = lane % 4;
  const int row0 = 16 * warp + g;  // this thread's heads: row0 and row0 + 8 (both warpgroups)
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // Prologue: the slots of chunks 0 and 1 with this CTA's share of q, stored swizzled in every
  // CTA of the cluster and fenced for the async proxy; then chunk 0's copies, one group.
  start_split<V::kHeads, V::kThreads, 2, true, kTokens>(
      p, cluster, plan, work, SwizzledRows<kHeadsPerCta>{smem + V::kSmem.q}, slots_s);
  if (n_chunks > 0) fetch(0);
  cp_async_commit();
  cluster_wait_acquire();  // q is complete in every CTA of the cluster
  fence_proxy_async();     // ... and visible to this thread's wgmma (reader side)

  const uint64_t desc_q = wgmma_desc_sw128(base + uint32_t(V::kSmem.q));
  float o[kOutTiles][32];
  zero_accumulators(o);
  auto fence_o = [&] { fence_accumulators(o); };
  auto o_flat = [&]() -> float(&)[kOutTiles * 32] {
    return reinterpret_cast<float(&)[kOutTiles * 32]>(o);
  };
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows row0, row0 + 8; log2 units

  for (int ch = 0; ch < n_chunks; ++ch) {
    // 1. Barrier 1: chunk ch has landed (this thread's copies: the only group in flight), both
    // proxies see it, and every thread is past the P V of chunk ch - 1.
    cp_async_wait<0>();
    fence_proxy_async();  // this thread's copies and zero fills -> wgmma
    __syncthreads();
    // 2. Chunk ch + 1 into the tile chunk ch - 1 left; the raw slots of chunk ch + 2.
    if (ch + 1 < n_chunks) fetch(ch + 1);
    cp_async_commit();
    const bool restage = threadIdx.x < kTokens && ch + 2 < n_chunks;
    const int64_t next_slot =
        restage ? raw_slot(p, work.indices, chunk0 + ch + 2, int(threadIdx.x), kTokens) : -1;

    // 3. S_w over the 576 dims for this warpgroup's 32 tokens, one group.
    const uint32_t tile = base + tile_offset(ch);
    float s[kSRegs];
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) {
      s[i] = 0.0f;
      fence_operand(s[i]);
    }
    wgmma_fence();
    scores<kWgTokens>(s, desc_q,
                      wgmma_desc_sw128(tile + uint32_t(wg * kWgTokens * kSwizzleRowBytes)),
                      std::make_integer_sequence<int, kScoreSteps>{});
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) fence_operand(s[i]);

    // 4. Scaled, masked (sparse_mla_load.cuh; s is the D fragment of the warpgroup's 32 tokens),
    // the row maxima of both warpgroups (barrier 2), the shared max, then p, l, alpha (this
    // warpgroup's l over its own tokens) and whether o must be rescaled (the same decision in the
    // same warp of either warpgroup; o * 1 is o anyway).
    float cmax[2];
    mask_scores(s, slots_of(ch) + wg * kWgTokens, qd, scale_log2, cmax);
    if (qd == 0) {
      rmax[wg * kHeadsPerCta + row0] = cmax[0];
      rmax[wg * kHeadsPerCta + row0 + 8] = cmax[1];
    }
    __syncthreads();
    // The chunk's max of rows row0 and row0 + 8: the same floats, in the same order, in both.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      cmax[r] = fmaxf(rmax[row0 + 8 * r], rmax[kHeadsPerCta + row0 + 8 * r]);
    }
    float alpha[2];
    const bool rescale = update_softmax(s, cmax, m, l, alpha);

    // 5. P of this warpgroup's tokens as register-A fragments (k16 steps 2 wg, 2 wg + 1 of the
    // chunk), stored for the other warpgroup (barrier 3); the other's loaded by the same t.
    uint32_t own[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) own[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
      pex[(wg * 2 + kk) * 128 + t] = make_uint4(own[kk][0], own[kk][1], own[kk][2], own[kk][3]);
    }
    __syncthreads();
    uint32_t a[kPvSteps][4];  // k16 step kk of the chunk: tokens [16 kk, 16 kk + 16)
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const uint4 other = pex[((wg ^ 1) * 2 + kk) * 128 + t];
      const uint32_t theirs[4] = {other.x, other.y, other.z, other.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        a[kk][r] = wg == 0 ? own[kk][r] : theirs[r];
        a[2 + kk][r] = wg == 0 ? theirs[r] : own[kk][r];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) fence_operand(a[kk][r]);
    }
    if (rescale) rescale_rows(o_flat(), alpha);
    fence_o();

    // 6. O_w += P V, one group: 4 k16 steps (tokens ascending) x 4 n64 tiles, waited here (a
    // group left pending across the loop's back edge makes ptxas serialize every wgmma, C7515).
    issue_pv_group<kPvSteps, kOutTiles, kTileBytes>(o, a, tile, wg);
    wgmma_wait<0>();
    fence_o();
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) fence_operand(a[kk][r]);
    }

    // 7. The slots of chunk ch + 2 over those of chunk ch - 1 (see the ring invariants).
    if (restage) slots_of(ch + 2)[threadIdx.x] = int32_t(checked_slot(p, next_slot));
  }
  cp_async_wait<0>();  // nothing in flight past here (the trailing group is empty)

  // l = l_0 + l_1 thread by thread (the same rows and quad columns in both warpgroups), then the
  // quad sum in finish_split: warpgroup 1's per-thread l through pex, dead once every thread is
  // past its last read (the first barrier).
  __syncthreads();
  auto* l_other = reinterpret_cast<float*>(smem + V::kSmem.pex);  // [2][128]
  if (wg == 1) {
    l_other[t] = l[0];
    l_other[128 + t] = l[1];
  }
  __syncthreads();
  if (wg == 0) {
    l[0] += l_other[t];
    l[1] += l_other[128 + t];
  }

  finish_split<V>(p, cluster, plan, work, smem, reinterpret_cast<const float(&)[128]>(o), m, l,
                  row0, wg * (kKvLoraRank / 2) + 2 * qd, wg == 0 && qd == 0);
}

}  // namespace

cudaError_t sparse_mla_wgmma64(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.topk < 0) return cudaErrorInvalidValue;
  // fp8 caches: the wgmma kernel. Slots are staged as int32: a pool of 2^31 tokens (2.5 TB of
  // bf16 latent) would go there too; no device holds one. Either choice is fixed per process
  // and pool, never by the batch.
  if (p.pool.dtype != KvDtype::kBf16 || p.pool.capacity() > INT32_MAX) {
    return sparse_mla_wgmma(p, stream);
  }
  static LaunchOnce once;
  return launch_split_clusters(sparse_mla_wgmma64_kernel, p,
                               split_plan(p.topk, max_splits(), kTokens), kHeadsPerCta,
                               kThreadsPerCta, Wg64Variant::kSmem.bytes, stream, once);
}

}  // namespace dsa::cuda
