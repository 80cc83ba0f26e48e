// Absorbed sparse MLA decode (DESIGN §1.7) on tensor cores (mma.sync m16n8k16 bf16, f32 acc),
// split over the selected tokens across the CTAs of a thread-block cluster.
//
// Launch: rows * G * S CTAs of 64 H / 16 threads in clusters of S, where H (heads per CTA: 64, 32
// or 16, G = ceil(heads / H) groups) follows the batch and S (splits) follows topk alone. CTA x
// is split x % S of head group (x / S) % G of row x / (S G): a row's groups run side by side, so
// its latent rows cross HBM once. The S CTAs of a cluster share one (row, group); CTA `split`
// (its rank in the cluster) walks the chunks [split * cps, (split + 1) * cps) of the row's
// selected tokens, cps = ceil(chunks / S), 32 tokens per chunk, flash-decoding style, and keeps
// an unnormalized partial (m, l, o). Each CTA reads 1/S of the group's q and stores it (bf16) in
// all S CTAs through distributed shared memory. The partials meet there too: CTA `split` combines
// the output dims [split * 512 / S, (split + 1) * 512 / S) of its H heads over the partials in
// the fixed order 0, 1, ..., S - 1.
//
// Batch invariance. A head's arithmetic is that of its 16-head m-tile, worked by one pair of
// warps, and it is the same in every variant: the 288/288 dim split of Q K^T within the pair,
// the 256/256 split of the output dims, the chunk order, the split boundaries (split_plan(),
// from topk alone) and the combine order. H only decides how many m-tiles (pairs) share a CTA and
// its latent chunks, and the ring depth only decides when a chunk arrives, so a row's bits are
// the same alone or in any batch, whatever variant the batch picks (the tests force each).
//
// Inside a CTA of T = H / 16 m-tiles, warp w: m-tile mt = w % T (16 heads) and half = w / T.
//   S = Q K^T over 576 dims: each warp of a pair (mt, 0), (mt, 1) computes the partial over its
//       288 dims, the pair swaps partials through shared memory and both form S = S_0 + S_1 (the
//       same f32 sum either way round), so both hold identical scores and softmax statistics.
//   Online softmax in f32 (exp2 with scale * log2 e folded in), invalid slots masked to -inf.
//   O += P V with P rounded to bf16 from the S accumulators in registers (the C fragment of S is
//       the A fragment of P) and V = c, the first 512 latent dims; each warp of the pair owns
//       256 of the 512 output dims (128 f32 accumulators per lane).
// Chunks land by cp.async in a ring of kStages stages (the deepest of 2..4 that fits: kStages - 1
// chunks in flight while one is computed). bf16: the stage is the chunk's bf16 rows. fp8: the
// stage holds the raw bytes (e4m3 by units of 64 values with their tile scale, the rope), which
// the thread that copied them dequantizes into one of 2 bf16 buffers after its own wait, before
// the step's barrier; the dead raw stage then holds the pair exchange. The selected slots are
// staged kStages chunks ahead.
//
// Napkin math (H200: 132 SMs; V3.2: 128 heads, topk 2048, S = 8 splits of 8 chunks):
//   Per chunk and m-tile pair: 136 mma.sync per warp and ~43 KB of ldmatrix reads per warp
//   (q 9 KB, k 18 KB, v 16 KB). Shared memory gives 128 B/clk per SM, so a 64-head CTA (4 pairs,
//   344 KB per chunk) needs >= 2700 clk (1.4 us) per chunk, a 16-head CTA (one pair) ~700 clk.
//   B = 1 with 64 heads per CTA: 2 x 8 = 16 CTAs, each 8 chunks in a row: >= 11 us of chunks
//   alone (37 us measured). With 16 heads per CTA: 8 x 8 = 64 CTAs, one pair each: 8 chunks of
//   ~0.5-0.8 us (latency-bound: one warp per SM sub-partition) + ~2 us prologue (indices and q,
//   then the first chunks) + ~1 us combine: ~7-9 us. fp8 adds the dequant, 16K values per chunk
//   and CTA (~3 instructions each): ~0.4 us per chunk for a 2-warp CTA, ~0.1 us for 8 warps.
//   Why not more splits at small B: the split count must not follow B, and S = 16 everywhere
//   costs every batch twice the per-CTA fixed work (partial: 128 KB f32 through DSMEM, four
//   cluster barrier phases; ~2-3 us per CTA, ~20 us at B = 64) or, through global memory, 2 KB of
//   partial per head and split: 4 MB per row, 268 MB at B = 64 (more than the 151 MB of latent
//   it reads). S = 16 (a non-portable cluster) halves B = 1's chunk chain (~3 us); it is a
//   process-wide option (DSA_CUDA_SPARSE_MLA_MAX_SPLITS=16) until measured at every B.
//   B = 64: 1024 CTAs of 64 heads = 7.8 waves of 8 chunks: at the shared-memory bound ~11 us per
//   CTA, ~100 us in all (~370 TFLOP/s); 327 us measured before (112 TFLOP/s). L2 -> SM traffic
//   per CTA: 288 KB of latent + 18 KB of q (147 KB when every CTA read all of its group's q).
// Variant choice (tiles_per_cta()): 64 heads whenever they fill a wave; else 64 or 32, the fewest
// waves x m-tiles per CTA, ties to more heads per CTA (fewer latent reads).
// DSA_CUDA_SPARSE_MLA_HEADS=16|32|64 forces one.
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

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/pdl.h"
#include "backend/cuda/sparse_mla_load.cuh"
#include "backend/cuda/sparse_mla_split.cuh"
#include "dsa/token_codec.h"

namespace dsa::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace sparse_mla_detail;

// The two warps (mt, 0) and (mt, 1) of a pair meet at named barrier 1 + mt (0 is __syncthreads).
__device__ __forceinline__ void pair_barrier(int mt) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + mt), "r"(64) : "memory");
}
// Partial S[16 heads, 32 tokens] of this warp over its 288 dims. The fragments of k-step ks + 1
// are loaded before the mma of k-step ks (two register sets), so ldmatrix latency hides behind
// the tensor cores even with one or two warps per SM sub-partition; the mma order per
// accumulator is the plain k order.
__device__ __forceinline__ void partial_scores(const __nv_bfloat16* q_s, const __nv_bfloat16* kv,
                                               int mt, int half, float (&s)[4][4]) {
  constexpr int kSteps = kHalfDims / 16;  // 18
  const int lane = threadIdx.x % 32;
  const uint32_t a_base =
      smem_addr(q_s + (mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch + (lane / 16) * 8) +
      uint32_t(half * kHalfDims) * 2;
  const uint32_t b_base =
      smem_addr(kv + ((lane / 16) * 8 + (lane % 8)) * kPitch + ((lane / 8) % 2) * 8) +
      uint32_t(half * kHalfDims) * 2;
#pragma unroll
  for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  uint32_t a[2][4], b01[2][4], b23[2][4];
  auto load = [&](int ks, int set) {
    ldmatrix_x4(a[set], a_base + uint32_t(ks * 16 * 2));
    ldmatrix_x4(b01[set], b_base + uint32_t(ks * 16 * 2));
    ldmatrix_x4(b23[set], b_base + uint32_t(ks * 16 * 2 + 16 * kPitch * 2));
  };
  load(0, 0);
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    const int set = ks & 1;
    if (ks + 1 < kSteps) load(ks + 1, set ^ 1);
    mma_bf16(s[0], a[set], b01[set][0], b01[set][1]);
    mma_bf16(s[1], a[set], b01[set][2], b01[set][3]);
    mma_bf16(s[2], a[set], b23[set][0], b23[set][1]);
    mma_bf16(s[3], a[set], b23[set][2], b23[set][3]);
  }
}

// O[16 heads, 256 dims of this half] += P[16, 32] V[32, 256], the V fragments of step i + 1
// loaded before the mma of step i (as in partial_scores).
__device__ __forceinline__ void accumulate_pv(const __nv_bfloat16* kv, int half,
                                              const float (&pr)[4][4], float (&o)[32][4]) {
  const int lane = threadIdx.x % 32;
  const uint32_t v_base = smem_addr(kv + (((lane / 8) % 2) * 8 + (lane % 8)) * kPitch +
                                    half * kHalfOut + (lane / 16) * 8);
  uint32_t a[2][4];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    a[kk][0] = pack_bf16(pr[2 * kk][0], pr[2 * kk][1]);
    a[kk][1] = pack_bf16(pr[2 * kk][2], pr[2 * kk][3]);
    a[kk][2] = pack_bf16(pr[2 * kk + 1][0], pr[2 * kk + 1][1]);
    a[kk][3] = pack_bf16(pr[2 * kk + 1][2], pr[2 * kk + 1][3]);
  }
  // Step i: k-step kk = i / 16 (tokens 16 kk..), output pair jp = i % 16 (dims 16 jp..).
  uint32_t b[2][4];
  auto load = [&](int i, int set) {
    ldmatrix_x4_trans(b[set], v_base + uint32_t((i / 16) * 16 * kPitch + (i % 16) * 16) * 2);
  };
  load(0, 0);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int set = i & 1;
    if (i + 1 < 32) load(i + 1, set ^ 1);
    mma_bf16(o[2 * (i % 16)], a[i / 16], b[set][0], b[set][1]);
    mma_bf16(o[2 * (i % 16) + 1], a[i / 16], b[set][2], b[set][3]);
  }
}

template <KvDtype D, int kTiles>
__global__ void __launch_bounds__(Variant<D, kTiles>::kThreads, 1)
    sparse_mla_kernel(SparseMlaParams p, SplitPlan plan) {
  pdl_enter();
  using V = Variant<D, kTiles>;
  constexpr int kStages = V::kStages, kRing = kStages + 1;  // latent stages, slot stages
  extern __shared__ __align__(16) uint8_t smem[];
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem + V::kSmem.q);
  auto* slots_s = reinterpret_cast<int64_t*>(smem + V::kSmem.slots);
  auto stage_of = [&](int chunk) {
    uint8_t* raw = smem + V::kSmem.raw + chunk % kStages * kRawStageBytes;
    return Stage{reinterpret_cast<__nv_bfloat16*>(smem + V::kSmem.kv) +
                     chunk % V::kSmem.kv_stages * kChunk * kPitch,
                 raw, raw + kChunk * kKvLoraRank,
                 reinterpret_cast<float*>(raw + kChunk * (kKvLoraRank + kRawRopeBytes))};
  };
  auto slots_of = [&](int chunk) { return slots_s + (chunk % kRing) * kChunk; };

  cg::cluster_group cluster = cg::this_cluster();
  const CtaWork work = cta_work(p, plan, V::kHeads, int(cluster.block_rank()));
  const int64_t* indices = work.indices;
  const int chunk0 = work.chunk0, n_chunks = work.n_chunks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int mt = warp % kTiles, half = warp / kTiles;
  const int g = lane / 4, c = lane % 4;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // Prologue, two memory round trips: the slots of the first kStages chunks with this CTA's
  // share of q (stored in every CTA of the cluster); then the first kStages - 1 chunks (one
  // cp.async group each, empty past the split's end), while the cluster's q stores settle.
  start_split<V::kHeads, V::kThreads, kStages, false>(p, cluster, plan, work, PaddedRows{q_s},
                                                      slots_s);
#pragma unroll
  for (int i = 0; i + 1 < kStages; ++i) {
    if (i < n_chunks) {
      const Stage st = stage_of(i);
      fetch_chunk<D, V::kThreads>(p, slots_of(i), st, PaddedRows{st.kv});
    }
    cp_async_commit();
  }
  cluster_wait_acquire();  // q is complete in every CTA of the cluster

  float o[32][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, log2 units
  for (int ch = 0; ch < n_chunks; ++ch) {
    const Stage st = stage_of(ch);
    const int64_t* slots = slots_of(ch);
    // Groups committed so far: one per chunk up to ch + kStages - 2; all but the newest
    // kStages - 2 have landed, so chunk ch has (this thread's copies).
    cp_async_wait<kStages - 2>();
    if constexpr (D == KvDtype::kFp8) dequantize_chunk<V::kThreads>(slots, st, PaddedRows{st.kv});
    // Chunk ch is visible to all, and every warp is done with step ch - 1: its stage
    // ((ch - 1) % kStages, refilled below with chunk ch + kStages - 1), its slot stage
    // ((ch + kStages) % kRing, restaged at the end of this step) and the exchange area (fp8: the
    // raw values of chunk ch, dead from here on) may be overwritten from here on.
    __syncthreads();
    const int ahead = ch + kStages - 1;
    if (ahead < n_chunks) {
      const Stage next = stage_of(ahead);
      fetch_chunk<D, V::kThreads>(p, slots_of(ahead), next, PaddedRows{next.kv});
    }
    cp_async_commit();
    const bool restage = threadIdx.x < kChunk && ch + kStages < n_chunks;
    const int64_t next_slot =
        restage ? raw_slot(p, indices, chunk0 + ch + kStages, threadIdx.x) : -1;

    float s[4][4];
    partial_scores(q_s, st.kv, mt, half, s);
    // fp8: the exchange is the raw stage of chunk ch, which every thread has dequantized.
    float* exchange = D == KvDtype::kFp8 ? reinterpret_cast<float*>(st.raw)
                                         : reinterpret_cast<float*>(smem + V::kSmem.exchange);
    float* mine = exchange + warp * 16 * 32;
    const float* partner = exchange + (warp ^ kTiles) * 16 * 32;
#pragma unroll
    for (int i = 0; i < 16; ++i) mine[i * 32 + lane] = s[i / 4][i % 4];
    pair_barrier(mt);
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i / 4][i % 4] += partner[i * 32 + lane];  // S_0 + S_1 in both

    // Online softmax over the chunk (the same step as the wgmma kernel's).
    softmax_step(reinterpret_cast<float(&)[16]>(s), slots, c, scale_log2, m, l,
                 reinterpret_cast<float(&)[128]>(o));
    accumulate_pv(st.kv, half, s, o);
    if (restage) slots_of(ch + kStages)[threadIdx.x] = checked_slot(p, next_slot);
  }

  // Every copy into the ring has landed, the last real one at the wait of the last step.
  finish_split<V>(p, cluster, plan, work, smem, reinterpret_cast<const float(&)[128]>(o), m, l,
                  mt * 16 + g, half * kHalfOut + c * 2, half == 0 && c == 0);
}

template <KvDtype D, int kTiles>
cudaError_t launch(const SparseMlaParams& p, const SplitPlan& plan, cudaStream_t stream) {
  using V = Variant<D, kTiles>;
  static LaunchOnce once;
  return launch_split_clusters(sparse_mla_kernel<D, kTiles>, p, plan, V::kHeads, V::kThreads,
                               V::kSmem.bytes, stream, once);
}

// m-tiles (16 heads each) per CTA: 4, 2 or 1. DSA_CUDA_SPARSE_MLA_HEADS=64|32|16 forces one (read
// at every call); otherwise (unset or auto) 4 when those CTAs fill a wave of the GPU, else 4 or 2,
// whichever gives the fewest waves x m-tiles per CTA (a CTA's chunk time grows with its m-tiles:
// they share its shared memory bandwidth), ties to 4 (fewer latent reads). One m-tile is never
// picked: on the H200 (bench/results/2026-12-03-h200-attn-mla.md) B = 1 took 37.1 us with 16 heads
// per CTA, 31.1 with 32 and 37.1 with 64 (bf16; fp8 40.7 / 35.8 / 42.4). Any choice gives the same
// bits.
int tiles_per_cta(const SparseMlaParams& p, const SplitPlan& plan) {
  if (const int forced = heads_knob(); forced > 0) return forced / 16;
  const int sms = device_sm_count() > 0 ? device_sm_count() : 132;
  auto ctas = [&](int tiles) {
    return int64_t(p.rows) * plan.splits * ((p.heads + 16 * tiles - 1) / (16 * tiles));
  };
  if (ctas(4) >= sms) return 4;
  int best = 4;
  int64_t best_cost = -1;
  for (int tiles : {4, 2}) {
    const int64_t cost = (ctas(tiles) + sms - 1) / sms * tiles;
    if (best_cost < 0 || cost < best_cost) best = tiles, best_cost = cost;
  }
  return best;
}

template <KvDtype D>
cudaError_t launch_dtype(const SparseMlaParams& p, cudaStream_t stream) {
  const SplitPlan plan = split_plan(p.topk, max_splits());
  switch (tiles_per_cta(p, plan)) {
    case 1:
      return launch<D, 1>(p, plan, stream);
    case 2:
      return launch<D, 2>(p, plan, stream);
    default:
      return launch<D, 4>(p, plan, stream);
  }
}

// The kernel family, the one place the default is chosen: the mma.sync kernel of this file, the
// wgmma kernel (sparse_mla_wgmma.cu) or the 64-token one (sparse_mla_wgmma64.cu, and its
// warp-specialized form sparse_mla_ws.cu). DSA_CUDA_SPARSE_MLA_VARIANT=ws|wgmma64|wgmma|mma forces
// one (read at every call; anything else: the default). They give different bits (their f32 sums
// run in different orders; ws and wgmma64 alone share theirs), each batch-invariant on its own:
// pick one for a whole process.
// The wgmma kernel replaced mma.sync on 2026-12-03: on the H200 it took 297.8 / 1143.6 us at B = 64
// / 256 (bf16; mma.sync 325.1 / 1251.6) and 335.6 / 1306.4 (fp8; 367.9 / 1436.5), and lost 3.5 us
// at B = 1 (34.6 against 31.1): bench/results/2026-12-03-h200-variants.md. The 64-token,
// token-split wgmma kernel (sparse_mla_wgmma64.cu, DSA_CUDA_SPARSE_MLA_VARIANT= wgmma64) became
// the default on 2026-12-04: 26.5 / 230.8 / 885.5 us at B = 1 / 64 / 256 (bf16) against the wgmma
// kernel's 31.4 / 271.8 / 1052.8 in the same process (bench/results/2026-12-04-h200-variants.md).
// wgmma64 serves bf16 caches; an fp8 cache (or a pool past INT32_MAX tokens) runs the wgmma
// kernel under it, a choice fixed by the pool, never by the batch. Its warp-specialized form
// (sparse_mla_ws.cu, =ws: the same bits, the warpgroups split by role) is faster at every
// batch: 20.9 / 194.7 / 725.5 us at B = 1 (graph) / 64 / 256 against wgmma64's 23.1 / 212.1 / 820.3
// in the same process (bench/results/2026-12-04-h200-mla-ws.md), and the default since the evening
// of 2026-12-04, once racecheck was clean over it (bench/results/2026-12-04-h200-mla-splits.md).
// Same bits as wgmma64, so a process that forces wgmma64 matches one that does not.
// =hn runs the heads-as-N kernel (sparse_mla_hn.cu: a CTA's 16 heads on wgmma's N, the chunk's
// tokens on M, for small batches; its own bits, bf16 and fp8 caches).
enum class MlaKernel { kMma, kWgmma, kWgmma64, kWs, kHn };
// The defaults, per cache dtype (the pool's, never the batch's): ws for both since 2026-12-05. On
// fp8 caches it expands each chunk to bf16 in its tile (sparse_mla_ws.cu) and runs 1.27-1.33x
// faster than the wgmma kernel: 44.7 / 217.7 / 754.3 us at B = 1 / 64 / 256 against 57.5 / 276.2
// / 1006.1 in the same process, on an H100 (bench/results/2026-12-05-h100-mla.md);
// DSA_CUDA_SPARSE_MLA_VARIANT=wgmma gives the former fp8 default and its bits.
constexpr MlaKernel kDefaultBf16Kernel = MlaKernel::kWs;
constexpr MlaKernel kDefaultFp8Kernel = MlaKernel::kWs;
MlaKernel mla_kernel(KvDtype dtype) {
  const char* v = std::getenv("DSA_CUDA_SPARSE_MLA_VARIANT");
  if (v != nullptr && std::strcmp(v, "wgmma") == 0) return MlaKernel::kWgmma;
  if (v != nullptr && std::strcmp(v, "mma") == 0) return MlaKernel::kMma;
  if (v != nullptr && std::strcmp(v, "wgmma64") == 0) return MlaKernel::kWgmma64;
  if (v != nullptr && std::strcmp(v, "ws") == 0) return MlaKernel::kWs;
  if (v != nullptr && std::strcmp(v, "hn") == 0) return MlaKernel::kHn;
  return dtype == KvDtype::kBf16 ? kDefaultBf16Kernel : kDefaultFp8Kernel;
}

}  // namespace

cudaError_t sparse_mla(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.topk < 0) return cudaErrorInvalidValue;
  const MlaKernel kernel = mla_kernel(p.pool.dtype);
  if (kernel == MlaKernel::kWgmma) return sparse_mla_wgmma(p, stream);
  if (kernel == MlaKernel::kWgmma64) return sparse_mla_wgmma64(p, stream);
  if (kernel == MlaKernel::kWs) return sparse_mla_ws(p, stream);
  if (kernel == MlaKernel::kHn) return sparse_mla_hn(p, stream);
  return p.pool.dtype == KvDtype::kBf16 ? launch_dtype<KvDtype::kBf16>(p, stream)
                                        : launch_dtype<KvDtype::kFp8>(p, stream);
}

}  // namespace dsa::cuda
