// Absorbed sparse MLA decode (DESIGN §1.7) on Hopper warpgroup MMA (wgmma, sm_90a): the
// DSA_CUDA_SPARSE_MLA_VARIANT=wgmma kernel. The split plan, the chunk of 32 selected tokens, the
// cluster's q distribution and its fixed-order combine are the mma.sync kernel's
// (sparse_mla.cu, sparse_mla_split.cuh); what changes is the math inside a CTA, which reads each
// latent chunk from shared memory once per 64 heads instead of once per 16.
//
// Launch: rows * G * S CTAs of 256 threads (two warpgroups) in clusters of S, G = ceil(heads /
// 64) head groups, S = split_plan(topk, max_splits()).splits (from topk and the process-wide
// bound alone). CTA x is split x % S of head group (x / S) % G of row x / (S G); split s walks
// the chunks [s cps, (s + 1) cps) of the row's selected tokens (cps = ceil(chunks / S)) and keeps
// an unnormalized partial (m, l, o) for its 64 heads; the cluster combines the partials in the
// order 0, 1, ..., S - 1 (combine_splits).
//
// Shared memory (offsets from a 1024-aligned base; 64 heads, 32-token chunks):
//   q    [9 tiles][64 heads][64 dims] bf16, 128-byte swizzled K-major (wgmma.cuh): 72 KiB, filled
//        once by the cluster (share_queries) and fenced to the async proxy.
//   kv   bf16: a ring of 3 chunk tiles [9][32 tokens][64 dims] swizzled (36 KiB each), filled by
//        cp.async straight from the cache rows (a token's 1152 bytes are its 9 tile rows).
//        fp8: 2 such tiles, dequantized from a ring of 3 raw stages (e4m3 + unit scales + rope,
//        21 KiB each, sparse_mla_load.cuh's format and dequant).
//   exchange [2 warpgroups][16][128 threads] f32 (bf16: 16 KiB; fp8: inside the raw stage of the
//        chunk being computed, dead once dequantized), slots [4][32] int64, m, l, coef.
//   bf16 207,360 bytes, fp8 218,624 (1 KiB of alignment slack included): one CTA per SM.
//
// One chunk, serial schedule (DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE=serial; all 256 threads are
// producers, warpgroup wg in {0, 1} is a consumer):
//   1. wait for the chunk's copies (cp.async.wait_group), fp8: dequantize the units this thread
//      copied into the bf16 tile; fence.proxy.async; __syncthreads (both warpgroups are past the
//      previous chunk's P V, whose tile the next copies overwrite).
//   2. issue the copies of chunk + 2 (one cp.async group per chunk, empty past the split's end).
//   3. S_wg[64 heads x 32 tokens] = Q K^T over this warpgroup's 288 of the 576 dims (the even
//      k16 steps for warpgroup 0, the odd ones for 1: both chains then run from the same two
//      base descriptors at fixed offsets): 18 wgmma.m64n32k16 (A = q tile, B = the chunk tile,
//      both K-major in smem), in k order from +0; wait.
//   4. The two partials meet in shared memory: each warpgroup stores its 16 accumulators per
//      thread, __syncthreads, and adds the other's: S = S_0 + S_1 in both (f32 addition
//      commutes, so both hold the same bits, hence the same softmax statistics and P).
//   5. Online softmax in f32 on the D fragment (rows 16 w + g and + 8 of the warpgroup's warp w,
//      columns 8 j + 2 q and + 1): scale * log2 e folded in, exp2, slots that are -1 / negative /
//      past the pool masked to -inf (never read: their tile rows are zeros), row max over the
//      quad, o rescaled unless no row max of the warp moved (o * 1 = o bitwise).
//   6. O_wg[64 heads x 256 dims] += P V: P packed to bf16 straight from the D fragment of S as the
//      register A operand (wgmma.cuh: two 8-column blocks of D are one k16 A fragment) and V = the
//      same chunk tile read MN-major (imm-trans-b = 1: a tile row is a token, i.e. a k row of V,
//      64 contiguous dims n). 2 k16 steps x 4 wgmma.m64n64k16 (one per 64-dim tile of the
//      warpgroup's 256 output dims; N <= 64, so LBO is never used); committed and waited.
// Overlapped schedule (DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE=overlap; kDefaultSchedule is the
// default): the same steps on the same values, in another order, so the same bits. Step k (k =
// 1 .. n - 1; chunk 0's steps 1-5 are the prologue, chunk n - 1's step 6 the epilogue):
//   1-2. the step barrier of chunk k (fp8: one barrier more before its dequant, see below),
//        issuing the copies of chunk k + 2 (fp8 only; bf16 issues its copies at the end of a
//        step, see below);
//   3. S(k) issued, one wgmma group; then 6. P V(k - 1) issued from the P of the previous step,
//      a second group;
//   wgmma.wait_group 1: S(k) has completed (groups complete in order), P V(k - 1) may still run;
//   4-5. the exchange (its barrier) and the softmax statistics of chunk k (m, l, P(k) packed into
//      registers other than those P V(k - 1) reads) while the tensor cores run P V(k - 1);
//   wgmma.wait_group 0, then o *= alpha(k) where the serial step rescales: after P V(k - 1) has
//   accumulated, before P V(k) (the same o, the same factor, the same bits); bf16: a barrier
//   over the warpgroup, and the copies of its own dims of chunk k + 2 (fetch_own_dims).
// So the exchange, the softmax and the next step's barrier and copy issue overlap P V; S and
// P V of neighbouring chunks run back to back on the tensor cores. Every group is waited inside
// its step: none is pending across the loop's back edge (ptxas serializes every wgmma then,
// C7515), and the registers of P V(k - 1)'s A operand stay live to its wait (a fence_operand
// after wait_group 0), else the compiler packs P(k) into them while the wgmma still reads them
// (C7513, serialized).
// Ring invariants, overlapped (k = the chunk whose step barrier it is):
//   - bf16, 3 tiles: after the barrier of k, tile (k - 1) % 3 is read by P V(k - 1), tile k % 3
//     by S(k) and P V(k), and tile (k + 1) % 3 is still landing: no tile is free there. But
//     the 64-dim tiles 4 wg .. 4 wg + 3 of a chunk are read by S (done in both warpgroups
//     before the exchange barrier of its chunk) and by warpgroup wg's P V alone, and the rope
//     tile by S alone. So at the end of the step of k (P V(k - 1) waited, then a barrier over
//     the warpgroup: all its warps are past the wait) warpgroup wg copies its 4 tiles and half
//     of the rope tile of chunk k + 2 into tile (k - 1) % 3 (fetch_own_dims; the other
//     warpgroup may still be reading its own 4 tiles there). The prologue copies chunks 0-2
//     whole; the step barrier of k waits for all of this thread's groups but the newest (chunk
//     k + 1; k = 0: the newest two). Two chunks in flight, as in the serial schedule.
//   - fp8: 3 raw stages and 2 tiles. The copies of chunk k + 2 go to raw stage (k - 1) % 3,
//     whose exchange (chunk k - 1) every thread finished before the barrier. The dequant of
//     chunk k writes tile k % 2, which P V(k - 2) read: every thread waits for its own
//     warpgroup's P V(k - 2) at the end of the previous step, and an extra barrier before the
//     dequant orders both warpgroups' waits before the rewrite.
//   - the exchange of chunk k (bf16: its own area; fp8: raw stage k % 3, dead once chunk k is
//     dequantized) is written after the barrier of k, which every thread passes only once it
//     has read the exchange of chunk k - 1.
//   - slots: 4 stages; the slots of chunk k + 3 are staged at the end of the step of k (the one
//     that waits for P V(k - 1); the prologue stages chunk 3), over those of chunk k - 1, which
//     every thread's softmax, copies and dequant are done with (they passed the exchange
//     barrier of k); the staging precedes at least one CTA barrier before the chunk's copies
//     are issued (bf16: at the end of the next step; fp8: at the step barrier of k + 1).
// Why S is split over dims and not computed twice: the redundant S would cost 36 instead of 18
// wgmma per warpgroup (+53% tensor work, +55 KiB of operand reads per chunk); the exchange is 32
// KiB of f32 traffic and one barrier. Why not one warpgroup for S and P through shared memory:
// the other would idle for the 36 S instructions.
//
// Batch invariance. Every number that enters a head's arithmetic is fixed by (heads, topk, the
// split bound): the chunk size, the split boundaries, which warpgroup computes which dims of S
// (k order within each chain fixed), the order S_0 + S_1, the P V order (k16 step 0 then 1 per
// accumulator, chunks ascending), the combine order. The batch only decides the grid size.
// wgmma is defined element-wise (D[i][j] sees only row i of A and column j of B: the argument of
// gemm_wgmma.cu, 3.), so other heads, tokens or rows never meet a head's sums. These bits differ
// from the mma.sync kernel's (its S halves are 288-dim sums over mma.m16n8k16 chains, different
// f32 association inside the tensor core); the variant is chosen per process.
//
// Proxy fences. wgmma reads shared memory through the async proxy: q's stores (local and remote,
// generic proxy) are followed by fence.proxy.async in the writing thread before the cluster
// barrier's release, and by fence.proxy.async.shared::cta in every reader after the acquire; the
// chunk copies / zero fills / dequantized rows by the writer's fence after its cp.async wait,
// then the barrier. The exchange, m, l and the partial o are generic-only. Shared memory that a
// wgmma read is rewritten only after that warpgroup's wgmma.wait_group and a barrier.
//
// Napkin math (H200: 132 SMs, ~1.8 GHz, 128 B/clk of shared memory and ~4 Kflop/clk of dense
// bf16 per SM; V3.2: 128 heads, topk 2048, 8 splits of 8 chunks):
//   Per chunk and CTA: tensor work 2 x 64 x 32 x (576 + 512) = 4.46 Mflop = ~1090 clk;
//   shared-memory traffic: S operands 2 x 18 x (2 KiB q + 1 KiB kv) = 108 KiB, exchange 32 KiB,
//   V 2 x 16 KiB = 32 KiB, copies in 36 KiB (fp8: raw 21 KiB in, 21 KiB read, 36 KiB out):
//   ~208 KiB = ~1660 clk. The mma.sync kernel moves ~344 KiB per 32-token chunk of 64 heads.
//   Serialized inside a CTA (barrier, copies issued, S ~900 clk at the smem bound, exchange
//   ~150, softmax ~100, P V ~550): ~1.9k clk, ~1 us per chunk.
//   B = 64: 64 x 2 x 8 = 1024 CTAs of 8 chunks; clusters of 8 CTAs of one SM each place ~128 at
//     a time: 8 waves x (8 chunks ~ 8 us + prologue (q: 147 KiB of f32 per group, shared by the
//     cluster) and combine ~3 us) ~ 90 us expected (~400 TFLOP/s); target <= 146 us.
//   B = 256: 32 such waves, ~350 us (~420 TFLOP/s); target >= 300 TFLOP/s.
//   B = 1: 16 CTAs, each 8 chunks in a row: ~8 us + ~2 us prologue + ~1 us combine ~ 11 us
//     (latency-bound: one CTA per SM, tensor cores mostly idle); target <= 12 us. With
//     DSA_CUDA_SPARSE_MLA_MAX_SPLITS=16 (process-wide), 4 chunks per CTA: ~7 us.
//   Overlapped: a step is barrier + copy issue + S (~900 clk) + max(P V ~550, exchange +
//     softmax ~250 + their barrier) + the rescale: ~1.6k clk, the exchange and softmax off the
//     critical path (~15% of the serial step on paper). Measured, the serial step is ~3 us, not
//     ~1: what the overlap hides there is the latency of the wait, barrier and shuffle chain
//     between S and P V, which the paper figures leave out. Its cost: one barrier more per
//     chunk (bf16: over a warpgroup, before its copies; fp8: over the CTA, before the
//     dequant), and bf16 copies issued at the end of a step instead of its start (a little
//     less than two steps to land).
// Check path: DSA_CUDA_SPARSE_MLA_WGMMA_PV=mma runs step 6 on mma.sync with V^T fragments from
// ldmatrix.trans (accumulate_pv_mma) instead of the register-A, MN-major wgmma: the same
// tolerances, other bits; it tells a fault of that wgmma form from one elsewhere.
// ptxas (sm_90a, nvcc 13, -Xptxas -v): serial 239 / 220 registers per thread (bf16 / fp8),
// overlapped 242 / 238, the check path 255 / 254; no spills, no wgmma serialization warning
// (C7513, C7515); 256 threads, so one CTA per SM by registers as by shared memory.
#include <cooperative_groups.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/pdl.h"
#include "backend/cuda/sparse_mla_load.cuh"
#include "backend/cuda/sparse_mla_split.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsa::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace sparse_mla_detail;

constexpr int kHeadsPerCta = 64;                              // one wgmma M
constexpr int kThreadsPerCta = 256;                           // two warpgroups
constexpr int kTiles64 = kLatentDim / 64;                     // 9 swizzled 64-dim tiles per row
constexpr int kQTileBytes = kHeadsPerCta * kSwizzleRowBytes;  // 8 KiB: [64 heads][64 dims]
constexpr int kKvTileBytes = kChunk * kSwizzleRowBytes;       // 4 KiB: [32 tokens][64 dims]
constexpr int kQBytes = kTiles64 * kQTileBytes;               // 72 KiB
constexpr int kChunkBytes = kTiles64 * kKvTileBytes;          // 36 KiB
constexpr int kHalfSteps = kLatentDim / 16 / 2;               // 18 k16 steps of S per warpgroup
constexpr int kSRegs = kChunk / 2;                            // 16: m64n32 f32 per thread
constexpr int kOutTiles = kKvLoraRank / 2 / 64;               // 4 n64 tiles of O per warpgroup
constexpr int kExchangeBytes = 2 * kSRegs * 128 * 4;          // 16 KiB
constexpr int kRingStages = 3;                                // chunks: 2 in flight, 1 computed
static_assert(kChunk == 32 && kKvTileBytes % kSwizzleAtomBytes == 0);
static_assert(kLatentDim % 64 == 0 && kKvLoraRank % 128 == 0);

constexpr Smem wg_layout(KvDtype dtype) {
  const bool fp8 = dtype == KvDtype::kFp8;
  Smem s{};
  s.kv_stages = fp8 ? 2 : kRingStages;
  s.q = 0;                                                                // 1024-aligned
  s.kv = s.q + kQBytes;                                                   // 1024-aligned
  s.raw = s.kv + size_t(s.kv_stages) * kChunkBytes;                       // fp8 raw stages
  s.exchange = s.raw + (fp8 ? size_t(kRingStages) * kRawStageBytes : 0);  // bf16 only
  s.slots = s.exchange + (fp8 ? 0 : size_t(kExchangeBytes));              // [4][32] int64
  s.m = s.slots + size_t(kRingStages + 1) * kChunk * 8;                   // [64] f32
  s.l = s.m + kHeadsPerCta * 4;                                           // [64] f32
  s.coef = s.l + kHeadsPerCta * 4;                                        // [64][kMaxSplits] f32
  s.bytes = s.coef + size_t(kHeadsPerCta) * kMaxSplits * 4 + kSwizzleAtomBytes;  // + align slack
  return s;
}

template <KvDtype D>
struct WgVariant {
  static constexpr int kHeads = kHeadsPerCta;
  static constexpr int kThreads = kThreadsPerCta;
  static constexpr int kStages = kRingStages;
  static constexpr Smem kSmem = wg_layout(D);
  static constexpr size_t kPartBytes = size_t(kHeads) * kPartPitch * 4;
  static_assert(kSmem.bytes <= kSmemLimit, "over the sm_90 dynamic shared memory limit");
  static_assert(kPartBytes <= kSmem.slots, "the partial o overlays q and the rings only");
  static_assert(kExchangeBytes <= kRawStageBytes, "fp8: the exchange lives in a raw stage");
  static_assert(kSmem.kv % kSwizzleAtomBytes == 0 && kChunkBytes % kSwizzleAtomBytes == 0);
  static_assert(kChunk * kPieces % kThreads == 0 && kChunk * kUnits % kThreads == 0);
};

// P V on mma.sync (the DSA_CUDA_SPARSE_MLA_WGMMA_PV=mma check path): each warp multiplies its 16
// heads' P (the same A fragments as the register-A wgmma) by V [32 tokens x 256 dims of this
// warpgroup], the V^T fragments read by ldmatrix.trans from the swizzled chunk tile at `tile`
// (generic address). o is the wgmma D layout flattened, which per warp is the m16n8 C layout of
// the 8-dim blocks J = 0..31: o[J][e]. Other bits than the wgmma path (another summation order
// inside the tensor core), the same within the tolerances: a check of the register-A / MN-major
// wgmma path against one that does not use it.
__device__ __forceinline__ void accumulate_pv_mma(const uint8_t* tile, int wg,
                                                  const uint32_t (&a)[2][4], float (&o)[32][4]) {
  // The lane through an empty asm: the 32 addresses are formed per call, not hoisted out of the
  // chunk loop into live registers.
  int lane = int(threadIdx.x % 32);
  asm volatile("" : "+r"(lane));
  // Lanes 8 i .. 8 i + 7 address the rows of matrix i: tokens 8 ((lane / 8) % 2) + lane % 8 of
  // the k16 step, dims 8 (lane / 16) of the 16-dim pair; the row's swizzle XOR is lane % 8.
  const uint32_t base = smem_addr(tile) + uint32_t((8 * ((lane / 8) % 2) + lane % 8) * 128);
#pragma unroll 1
  for (int kk = 0; kk < 2; ++kk) {  // k16 steps, then 16-dim pairs
    uint32_t ak[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) ak[r] = kk == 0 ? a[0][r] : a[1][r];
#pragma unroll
    for (int pair = 0; pair < 16; ++pair) {
      const int dim = wg * (kKvLoraRank / 2) + pair * 16 + (lane / 16) * 8;
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + uint32_t(kk * 16 * 128 + (dim / 64) * kKvTileBytes +
                                           ((((dim % 64) / 8) ^ (lane % 8)) << 4)));
      mma_bf16(o[2 * pair], ak, b[0], b[1]);
      mma_bf16(o[2 * pair + 1], ak, b[2], b[3]);
    }
  }
}

// S over this warpgroup's 18 k16 steps, in order: step i reads k16 block 2 (i % 2) of 64-dim
// tile i / 2 (plus the warpgroup's block, in the base descriptors) of q and of the chunk.
template <int... kI>
__device__ __forceinline__ void partial_scores(float (&s)[kSRegs], uint64_t desc_q,
                                               uint64_t desc_kv,
                                               std::integer_sequence<int, kI...>) {
  (wgmma_bf16_n32_at<((kI / 2) * kQTileBytes + (kI % 2) * 64) / 16,
                     ((kI / 2) * kKvTileBytes + (kI % 2) * 64) / 16>(s, desc_q, desc_kv),
   ...);
}

// The overlapped schedule's bf16 copies: warpgroup wg's share of a chunk, the dims that only its
// own P V reads (64-dim tiles 4 wg .. 4 wg + 3) and half of the rope tile (which only S reads),
// into the chunk tile `rows` from its staged slots: 36 16-byte pieces per token, 9 per thread
// (thread t of the warpgroup), zeros for unused tokens. The caller commits the group.
__device__ __forceinline__ void fetch_own_dims(const SparseMlaParams& p, const int64_t* slots,
                                               SwizzledRows<kChunk> rows, int wg, int t) {
  constexpr int kOwnPieces = kKvLoraRank / 2 / 8 + kRopePieces / 2;  // 32 + 4
  static_assert(kChunk * kOwnPieces % 128 == 0);
#pragma unroll
  for (int i = 0; i < kChunk * kOwnPieces / 128; ++i) {
    const int idx = t + i * 128;
    const int token = idx / kOwnPieces, piece = idx % kOwnPieces;
    const int dim = piece < 32 ? wg * (kKvLoraRank / 2) + piece * 8
                               : kKvLoraRank + wg * (kRopePieces / 2) * 8 + (piece - 32) * 8;
    const int64_t slot = slots[token];
    __nv_bfloat16* dst = rows(token, dim);
    if (slot >= 0) {
      cp_async16(dst, p.pool.data + slot * (kLatentDim * 2) + dim * 2);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Barrier 1 + wg over the 128 threads of warpgroup wg (barrier 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_barrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}

// The two schedules of the token loop (the header's "One chunk" and "Overlapped schedule"):
// the same instructions on the same values, so the same bits.
enum class Schedule { kSerial, kOverlap };
// The schedule when DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE is unset.
constexpr Schedule kDefaultSchedule = Schedule::kSerial;

template <KvDtype D, bool kPvWgmma, Schedule kSchedule>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sparse_mla_wgmma_kernel(SparseMlaParams p, SplitPlan plan) {
  pdl_enter();
  using V = WgVariant<D>;
  constexpr int kStages = V::kStages, kRing = kStages + 1;  // latent stages, slot stages
  constexpr bool kFp8 = D == KvDtype::kFp8;
  constexpr bool kOverlap = kSchedule == Schedule::kOverlap;
  static_assert(kPvWgmma || !kOverlap, "the overlapped schedule needs P V on wgmma");
  // Serial, and fp8 overlapped: the step barrier of chunk k issues the copies of chunk k + 2
  // (fp8 overlapped: into the 3 raw stages; only the dequantized rows use the 2 tiles).
  // bf16 overlapped: the 3 tiles hold chunk k - 1 (P V in flight), k (S) and one more after
  // that barrier, so each warpgroup copies its own dims of chunk k + 3 once its P V of chunk k
  // has completed, at the end of the step (fetch_own_dims); two chunks in flight either way.
  constexpr bool kOwnCopies = kOverlap && !kFp8;
  constexpr int kAhead = kStages - 1;
  constexpr int kPrologueChunks = kOwnCopies ? kStages : kAhead;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The swizzle atoms need 1024-byte alignment. The pad is the same in every CTA of the cluster
  // (the same kernel), so mapped addresses agree.
  uint8_t* smem = align_to_atom(smem_raw);
  const uint32_t base = smem_addr(smem);

  auto* slots_s = reinterpret_cast<int64_t*>(smem + V::kSmem.slots);
  auto slots_of = [&](int chunk) { return slots_s + (chunk % kRing) * kChunk; };
  auto tile_offset = [&](int chunk) {
    return uint32_t(V::kSmem.kv + size_t(chunk % V::kSmem.kv_stages) * kChunkBytes);
  };
  auto stage_of = [&](int chunk) {  // fp8: the raw stage; bf16: unused beyond kv
    uint8_t* raw = smem + V::kSmem.raw + chunk % kStages * kRawStageBytes;
    return Stage{nullptr, raw, raw + kChunk * kKvLoraRank,
                 reinterpret_cast<float*>(raw + kChunk * (kKvLoraRank + kRawRopeBytes))};
  };
  auto rows_of = [&](int chunk) { return SwizzledRows<kChunk>{smem + tile_offset(chunk)}; };
  auto fetch = [&](int chunk) {
    fetch_chunk<D, V::kThreads>(p, slots_of(chunk), stage_of(chunk), rows_of(chunk));
  };

  cg::cluster_group cluster = cg::this_cluster();
  // plan.heads_per_cta heads (16, 32 or 64) in the tile's first rows (heads_per_cta).
  const CtaWork work = cta_work(p, plan, plan.heads_per_cta, int(cluster.block_rank()));
  const int64_t* indices = work.indices;
  const int chunk0 = work.chunk0, n_chunks = work.n_chunks;
  const int wg = int(threadIdx.x) / 128, t = int(threadIdx.x) % 128;
  const int warp = t / 32, lane = t % 32, g = lane / 4, qd = lane % 4;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // Prologue (as the mma.sync kernel's): the slots of the first kStages chunks with this CTA's
  // share of q, stored swizzled in every CTA of the cluster and fenced for the async proxy; then
  // the first kPrologueChunks chunks, one cp.async group each.
  start_split<V::kHeads, V::kThreads, kStages, true>(
      p, cluster, plan, work, SwizzledRows<kHeadsPerCta>{smem + V::kSmem.q}, slots_s);
#pragma unroll
  for (int i = 0; i < kPrologueChunks; ++i) {
    if (i < n_chunks) fetch(i);
    cp_async_commit();
  }
  cluster_wait_acquire();  // q is complete in every CTA of the cluster
  fence_proxy_async();     // ... and visible to this thread's wgmma (reader side)

  const uint32_t q_base = base + uint32_t(V::kSmem.q);
  float o[kOutTiles][32];
  zero_accumulators(o);
  auto fence_o = [&] { fence_accumulators(o); };
  auto o_flat = [&]() -> float(&)[kOutTiles * 32] {
    return reinterpret_cast<float(&)[kOutTiles * 32]>(o);
  };
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, log2 units

  // 1-2. The step barrier of chunk k: its copies have landed (fp8: dequantized into its tile),
  // both proxies see them, and (unless kOwnCopies) the copies of chunk k + 2 are issued. Groups
  // committed so far: one per chunk up to k + 1 (k = 0, kOwnCopies: up to 2), so all but the
  // newest one (two) have landed, chunk k among them (this thread's copies). After the barrier
  // every thread is done with the S exchange of chunk k - 1, with the P V of chunk k - 1
  // (serial) or k - 2 (overlapped), hence with the tile and raw stage the copies of chunk k + 2
  // overwrite (see the header's ring invariants).
  auto step_barrier = [&](int k) {
    if (kOwnCopies && k == 0) {
      cp_async_wait<kStages - 1>();
    } else {
      cp_async_wait<kAhead - 1>();
    }
    if constexpr (kFp8) {
      // Overlapped: tile k % 2 was read by the P V of chunk k - 2, which the other warpgroup
      // may still be waiting for; this barrier orders its wait before the rows' rewrite.
      if constexpr (kOverlap) __syncthreads();
      dequantize_chunk<V::kThreads>(slots_of(k), stage_of(k), rows_of(k));
    }
    fence_proxy_async();  // this thread's copies, zero fills, dequantized rows -> wgmma
    __syncthreads();
    if constexpr (!kOwnCopies) {
      if (k + kAhead < n_chunks) fetch(k + kAhead);
      cp_async_commit();
    }
  };
  // The slots of chunk r = restage_chunk(k) are staged at the end of the step that issues the
  // P V of chunk k (serial r = k + kStages; overlapped r = k + kRing, the prologue's k = -1
  // included), before any barrier-ordered read of them (the copies issued at a later step). Its
  // slot stage is that of chunk r - kRing (k - 1 serial, k overlapped), whose softmax, copies
  // and dequant every thread finished before this step's barriers.
  auto restage_chunk = [&](int k) { return k + (kOverlap ? kRing : kStages); };
  auto restages = [&](int k) {
    const int r = restage_chunk(k);
    return threadIdx.x < kChunk && r >= kStages && r < n_chunks;
  };
  auto load_slot = [&](int k) {
    return restages(k) ? raw_slot(p, indices, chunk0 + restage_chunk(k), threadIdx.x) : -1;
  };
  auto store_slot = [&](int k, int64_t raw) {
    if (restages(k)) slots_of(restage_chunk(k))[threadIdx.x] = checked_slot(p, raw);
  };

  // 3. This warpgroup's partial S of chunk k over the k16 steps ks = 2 i + wg, i = 0..17 (the
  // odd or the even ones: step 2 i + wg is k16 block kk = 2 (i % 2) + wg of 64-dim tile i / 2),
  // issued and committed as one group.
  float s[kSRegs];
  auto issue_scores = [&](int k) {
    const uint32_t tile = base + tile_offset(k);
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) {
      s[i] = 0.0f;
      fence_operand(s[i]);
    }
    wgmma_fence();
    partial_scores(s, wgmma_desc_sw128(q_base + uint32_t(wg * 32)),
                   wgmma_desc_sw128(tile + uint32_t(wg * 32)),
                   std::make_integer_sequence<int, kHalfSteps>{});
    wgmma_commit();
  };
  // 4-5. Once the S group of chunk k has completed: S = S_0 + S_1 in both warpgroups (fp8: the
  // exchange is the raw stage of chunk k, which every thread dequantized before the step
  // barrier), the online softmax statistics and P packed to bf16 into a (the A fragment of k16
  // step kk is the D fragment's blocks 2 kk and 2 kk + 1). Returns whether o must be rescaled by
  // alpha (the rescale itself is the caller's: after the P V that accumulates into o).
  auto scores_to_p = [&](int k, uint32_t(&a)[2][4], float(&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) fence_operand(s[i]);
    float* exchange = kFp8 ? reinterpret_cast<float*>(stage_of(k).raw)
                           : reinterpret_cast<float*>(smem + V::kSmem.exchange);
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) exchange[(wg * kSRegs + i) * 128 + t] = s[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] += exchange[((wg ^ 1) * kSRegs + i) * 128 + t];
    const bool rescale = softmax_scores(s, slots_of(k), qd, scale_log2, m, l, alpha);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        a[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        fence_operand(a[kk][r]);
      }
    }
    return rescale;
  };
  // 6. O_wg += P V of chunk k, issued and committed as one group. The caller has fenced o and a
  // (fence_o, fence_operand) where it last wrote them: inside the overlapped step that point
  // lies before the S group's issue, so nothing between the two groups defines their registers
  // (which would make ptxas serialize the wgmma, C7513).
  auto issue_pv = [&](int k, const uint32_t(&a)[2][4]) {
    issue_pv_group<2, kOutTiles, kKvTileBytes>(o, a, base + tile_offset(k), wg);
  };

  if constexpr (!kOverlap) {
    for (int ch = 0; ch < n_chunks; ++ch) {
      step_barrier(ch);
      const int64_t next_slot = load_slot(ch);
      issue_scores(ch);
      wgmma_wait<0>();
      uint32_t a[2][4];
      float alpha[2];
      if (scores_to_p(ch, a, alpha)) rescale_rows(o_flat(), alpha);
      if constexpr (kPvWgmma) {
        fence_o();
        issue_pv(ch, a);
        // Waited here, not at the next chunk's barrier: a group left pending across the loop's
        // back edge makes ptxas serialize every wgmma of the kernel (C7515).
        wgmma_wait<0>();
        fence_o();
      } else {
        accumulate_pv_mma(smem + tile_offset(ch), wg, a, reinterpret_cast<float(&)[32][4]>(o));
      }
      store_slot(ch, next_slot);
    }
  } else if (n_chunks > 0) {
    // Overlapped: the step of chunk ch + 1 issues its S, then the P V of chunk ch, waits for
    // the S group only (wgmma groups complete in order), exchanges and runs the softmax of
    // chunk ch + 1 while the P V runs, then waits for it and rescales o. Every group is waited
    // inside the step (none pending across the back edge, see above). Chunk 0's S and softmax
    // are the prologue, chunk n - 1's P V the epilogue.
    uint32_t a[2][4];
    float alpha[2];
    step_barrier(0);
    int64_t next_slot = load_slot(-1);
    issue_scores(0);
    wgmma_wait<0>();
    if (scores_to_p(0, a, alpha)) rescale_rows(o_flat(), alpha);  // o = 0: the serial bits
    fence_o();
    store_slot(-1, next_slot);
    for (int ch = 0; ch + 1 < n_chunks; ++ch) {
      step_barrier(ch + 1);
      next_slot = load_slot(ch);
      issue_scores(ch + 1);
      issue_pv(ch, a);
      wgmma_wait<1>();  // S of chunk ch + 1 (the P V of chunk ch may still run)
      uint32_t a_next[2][4];
      const bool rescale = scores_to_p(ch + 1, a_next, alpha);
      wgmma_wait<0>();  // the P V of chunk ch: o and a are free again
      fence_o();
      // a stays live up to here, so the compiler cannot build a_next in its registers while
      // the P V still reads them (ptxas would serialize every wgmma, C7513).
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) fence_operand(a[kk][r]);
      }
      if (rescale) rescale_rows(o_flat(), alpha);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          a[kk][r] = a_next[kk][r];
          fence_operand(a[kk][r]);
        }
      }
      fence_o();
      if constexpr (kOwnCopies) {
        // This warpgroup's P V of chunk ch has completed in all its warps, and every S of chunk
        // ch before the exchange barrier of ch: its dims of tile ch % 3 are free for chunk
        // ch + 3.
        warpgroup_barrier(wg);
        if (ch + kStages < n_chunks) {
          fetch_own_dims(p, slots_of(ch + kStages), rows_of(ch + kStages), wg, t);
        }
        cp_async_commit();
      }
      store_slot(ch, next_slot);
    }
    issue_pv(n_chunks - 1, a);
    wgmma_wait<0>();
    fence_o();
  }
  cp_async_wait<0>();  // nothing in flight past here (the trailing groups are empty)

  finish_split<V>(p, cluster, plan, work, smem, reinterpret_cast<const float(&)[128]>(o), m, l,
                  16 * warp + g, wg * (kKvLoraRank / 2) + 2 * qd, wg == 0 && qd == 0);
}

template <KvDtype D, bool kPvWgmma, Schedule kSchedule>
cudaError_t launch(const SparseMlaParams& p, cudaStream_t stream) {
  using V = WgVariant<D>;
  static LaunchOnce once;
  SplitPlan plan = split_plan(p.topk, max_splits());
  const SplitKernel kernel = sparse_mla_wgmma_kernel<D, kPvWgmma, kSchedule>;
  plan.heads_per_cta = heads_per_cta(
      p, plan, [&] { return wave_ctas(kernel, plan.splits, V::kThreads, V::kSmem.bytes, once); });
  return launch_split_clusters(kernel, p, plan, plan.heads_per_cta, V::kThreads, V::kSmem.bytes,
                               stream, once);
}

// DSA_CUDA_SPARSE_MLA_WGMMA_PV=mma (read at every call): P V on mma.sync instead of the
// register-A wgmma (accumulate_pv_mma): a check path with other bits, not for serving.
bool pv_on_wgmma() {
  const char* v = std::getenv("DSA_CUDA_SPARSE_MLA_WGMMA_PV");
  return v == nullptr || std::strcmp(v, "mma") != 0;
}

// DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE=serial | overlap (read at every call; anything else:
// kDefaultSchedule). Both give the same bits; the check path (P V on mma.sync) is serial only.
Schedule schedule() {
  const char* v = std::getenv("DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE");
  if (v != nullptr && std::strcmp(v, "serial") == 0) return Schedule::kSerial;
  if (v != nullptr && std::strcmp(v, "overlap") == 0) return Schedule::kOverlap;
  return kDefaultSchedule;
}

template <KvDtype D>
cudaError_t launch_dtype(const SparseMlaParams& p, cudaStream_t stream) {
  if (!pv_on_wgmma()) return launch<D, false, Schedule::kSerial>(p, stream);
  return schedule() == Schedule::kOverlap ? launch<D, true, Schedule::kOverlap>(p, stream)
                                          : launch<D, true, Schedule::kSerial>(p, stream);
}

}  // namespace

cudaError_t sparse_mla_wgmma(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.topk < 0) return cudaErrorInvalidValue;
  return p.pool.dtype == KvDtype::kBf16 ? launch_dtype<KvDtype::kBf16>(p, stream)
                                        : launch_dtype<KvDtype::kFp8>(p, stream);
}

}  // namespace dsa::cuda
