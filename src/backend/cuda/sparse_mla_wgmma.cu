// Absorbed sparse MLA decode (DESIGN §1.7) on Hopper warpgroup MMA (wgmma, sm_90a): the
// DSA_CUDA_SPARSE_MLA_VARIANT=wgmma kernel. The split plan, the chunk of 32 selected tokens, the
// cluster's q distribution and its fixed-order combine are the mma.sync kernel's
// (sparse_mla.cu, sparse_mla_load.cuh); what changes is the math inside a CTA, which reads each
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
// One chunk (all 256 threads are producers; warpgroup wg in {0, 1} is a consumer):
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
// Check path: DSA_CUDA_SPARSE_MLA_WGMMA_PV=mma runs step 6 on mma.sync with V^T fragments from
// ldmatrix.trans (accumulate_pv_mma) instead of the register-A, MN-major wgmma: the same
// tolerances, other bits; it tells a fault of that wgmma form from one elsewhere.
// ptxas (sm_90a, nvcc 13, -Xptxas -v): 245 / 225 registers per thread (bf16 / fp8; the check
// path 255 / 254), no spills, no wgmma serialization warning (C7515); 256 threads, so one CTA
// per SM by registers as by shared memory.
#include <cooperative_groups.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/sparse_mla_load.cuh"
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

template <KvDtype D, bool kPvWgmma>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sparse_mla_wgmma_kernel(SparseMlaParams p, SplitPlan plan) {
  using V = WgVariant<D>;
  constexpr int kStages = V::kStages, kRing = kStages + 1;  // latent stages, slot stages
  constexpr bool kFp8 = D == KvDtype::kFp8;
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
  const CtaWork work = cta_work(p, plan, V::kHeads, int(cluster.block_rank()));
  const int64_t* indices = work.indices;
  const int chunk0 = work.chunk0, n_chunks = work.n_chunks;
  const int wg = int(threadIdx.x) / 128, t = int(threadIdx.x) % 128;
  const int warp = t / 32, lane = t % 32, g = lane / 4, qd = lane % 4;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // Prologue (as the mma.sync kernel's): the slots of the first kStages chunks with this CTA's
  // share of q, stored swizzled in every CTA of the cluster and fenced for the async proxy; then
  // the first kStages - 1 chunks.
  start_split<V::kHeads, V::kThreads, kStages, true>(
      p, cluster, plan, work, SwizzledRows<kHeadsPerCta>{smem + V::kSmem.q}, slots_s);
#pragma unroll
  for (int i = 0; i + 1 < kStages; ++i) {
    if (i < n_chunks) fetch(i);
    cp_async_commit();
  }
  cluster_wait_acquire();  // q is complete in every CTA of the cluster
  fence_proxy_async();     // ... and visible to this thread's wgmma (reader side)

  const uint32_t q_base = base + uint32_t(V::kSmem.q);
  float o[kOutTiles][32];
#pragma unroll
  for (int nb = 0; nb < kOutTiles; ++nb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[nb][i] = 0.0f;
  }
  auto fence_o = [&] {
#pragma unroll
    for (int nb = 0; nb < kOutTiles; ++nb) {
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_operand(o[nb][i]);
    }
  };
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, log2 units
  for (int ch = 0; ch < n_chunks; ++ch) {
    const int64_t* slots = slots_of(ch);
    // Groups committed so far: one per chunk up to ch + kStages - 2; all but the newest
    // kStages - 2 have landed, so chunk ch has (this thread's copies).
    cp_async_wait<kStages - 2>();
    if constexpr (kFp8) dequantize_chunk<V::kThreads>(slots, stage_of(ch), rows_of(ch));
    fence_proxy_async();  // this thread's copies, zero fills, dequantized rows -> wgmma
    // Chunk ch is visible to all (both proxies), and every warpgroup is done with chunk ch - 1:
    // its tile (refilled below with chunk ch + kStages - 1 for bf16; fp8 dequantizes into tile
    // ch % 2 next step), its slot stage ((ch + kStages) % kRing, restaged at the end of this
    // step) and the exchange area may be overwritten from here on.
    __syncthreads();
    const int ahead = ch + kStages - 1;
    if (ahead < n_chunks) fetch(ahead);
    cp_async_commit();
    const bool restage = threadIdx.x < kChunk && ch + kStages < n_chunks;
    const int64_t next_slot =
        restage ? raw_slot(p, indices, chunk0 + ch + kStages, threadIdx.x) : -1;

    // 3. This warpgroup's partial S over the k16 steps ks = 2 i + wg, i = 0..17 (the odd or the
    // even ones: step 2 i + wg is k16 block kk = 2 (i % 2) + wg of 64-dim tile i / 2).
    const uint32_t tile = base + tile_offset(ch);
    float s[kSRegs];
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
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) fence_operand(s[i]);

    // 4. S = S_0 + S_1 in both warpgroups. fp8: the exchange is the raw stage of chunk ch, which
    // every thread has dequantized before the barrier above.
    float* exchange = kFp8 ? reinterpret_cast<float*>(stage_of(ch).raw)
                           : reinterpret_cast<float*>(smem + V::kSmem.exchange);
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) exchange[(wg * kSRegs + i) * 128 + t] = s[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] += exchange[((wg ^ 1) * kSRegs + i) * 128 + t];

    // 5. Online softmax over the chunk.
    softmax_step(s, slots, qd, scale_log2, m, l, reinterpret_cast<float(&)[kOutTiles * 32]>(o));

    // 6. O += P V: the A fragment of k16 step kk is the D fragment's blocks 2 kk and 2 kk + 1.
    uint32_t a[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        a[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        fence_operand(a[kk][r]);
      }
    }
    if constexpr (kPvWgmma) {
      fence_o();
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int nb = 0; nb < kOutTiles; ++nb) {
          // V rows [16 kk, 16 kk + 16) (two atoms) of the 64-dim tile wg * 4 + nb.
          const uint32_t v =
              tile + uint32_t((wg * kOutTiles + nb) * kKvTileBytes + kk * 2 * kSwizzleAtomBytes);
          wgmma_bf16_rs_mn64(o[nb], a[kk], wgmma_desc_sw128_mn(v, kKvTileBytes));
        }
      }
      wgmma_commit();
      // Waited here, not at the next chunk's barrier: a group left pending across the loop's
      // back edge makes ptxas serialize every wgmma of the kernel (C7515), which costs far more
      // than the overlap with the next chunk's cp.async wait would give.
      wgmma_wait<0>();
      fence_o();
    } else {
      accumulate_pv_mma(smem + tile_offset(ch), wg, a, reinterpret_cast<float(&)[32][4]>(o));
    }
    if (restage) slots_of(ch + kStages)[threadIdx.x] = checked_slot(p, next_slot);
  }
  cp_async_wait<0>();  // nothing in flight past here (the trailing groups are empty)

  finish_split<V>(p, cluster, plan, work, smem, reinterpret_cast<const float(&)[128]>(o), m, l,
                  16 * warp + g, wg * (kKvLoraRank / 2) + 2 * qd, wg == 0 && qd == 0);
}

template <KvDtype D, bool kPvWgmma>
cudaError_t launch(const SparseMlaParams& p, cudaStream_t stream) {
  using V = WgVariant<D>;
  static LaunchOnce once;
  return launch_split_clusters(sparse_mla_wgmma_kernel<D, kPvWgmma>, p,
                               split_plan(p.topk, max_splits()), V::kHeads, V::kThreads,
                               V::kSmem.bytes, stream, once);
}

// DSA_CUDA_SPARSE_MLA_WGMMA_PV=mma (read at every call): P V on mma.sync instead of the
// register-A wgmma (accumulate_pv_mma): a check path with other bits, not for serving.
bool pv_on_wgmma() {
  const char* v = std::getenv("DSA_CUDA_SPARSE_MLA_WGMMA_PV");
  return v == nullptr || std::strcmp(v, "mma") != 0;
}

template <KvDtype D>
cudaError_t launch_dtype(const SparseMlaParams& p, cudaStream_t stream) {
  return pv_on_wgmma() ? launch<D, true>(p, stream) : launch<D, false>(p, stream);
}

}  // namespace

cudaError_t sparse_mla_wgmma(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.topk < 0) return cudaErrorInvalidValue;
  return p.pool.dtype == KvDtype::kBf16 ? launch_dtype<KvDtype::kBf16>(p, stream)
                                        : launch_dtype<KvDtype::kFp8>(p, stream);
}

}  // namespace dsa::cuda
