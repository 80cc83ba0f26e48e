// The split side of the sparse MLA kernels (sparse_mla.cu, sparse_mla_wgmma.cu,
// sparse_mla_wgmma64.cu): the CTAs of one (row, head group) form a cluster, one per split of the
// row's selected tokens. Here: q's distribution over the cluster through distributed shared
// memory (start_split), the cluster's fixed-order combine of the splits' partials (finish_split,
// combine_splits), the split bound and the clustered launch. The per-chunk data movement and the
// softmax step are in sparse_mla_load.cuh.
#pragma once

#include <cooperative_groups.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/sparse_mla_load.cuh"
#include "backend/cuda/wgmma.cuh"
#include "dsa/ops.h"

namespace dsa::cuda::sparse_mla_detail {

// q of the cluster's kHeads heads, rounded to bf16, into q_at (head, dim) of every CTA of the
// cluster (heads head0 .. head0 + heads - 1; the rows past them are zero): CTA `split` reads
// 1/splits of the 4-float pieces (16-byte loads when the row is 16-byte aligned; a head's 576
// floats keep that alignment) and stores them in all `splits` CTAs, so the row's q crosses L2 once
// per head group instead of once per CTA. The caller has arrived at the cluster barrier once; this
// waits for that phase (every CTA has started, so its shared memory may be written) before the
// first remote store.
template <int kHeads, int kThreads, class Rows>
__device__ void share_queries(const SparseMlaParams& p, cg::cluster_group& cluster, int splits,
                              int split, int row, int head0, int heads, Rows q_at) {
  constexpr int kRowPieces = kLatentDim / 4;  // 144 per head
  constexpr int kBatch = 6;                   // loads in flight per thread
  const int share = kHeads * kRowPieces / splits, begin = split * share;
  const float* q = p.q + int64_t(row) * p.ld_q;
  const bool aligned = (reinterpret_cast<uintptr_t>(q) & 15u) == 0;
  for (int b0 = 0; b0 < share; b0 += kBatch * kThreads) {
    float4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int at = b0 + i * kThreads + int(threadIdx.x);
      const int h = (begin + at) / kRowPieces, d = (begin + at) % kRowPieces * 4;
      v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (at >= share || h >= heads) continue;
      const float* src = q + int64_t(head0 + h) * kLatentDim + d;
      v[i] = aligned ? __ldg(reinterpret_cast<const float4*>(src))
                     : make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
    }
    if (b0 == 0) cluster_wait_acquire();
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int at = b0 + i * kThreads + int(threadIdx.x);
      if (at >= share) continue;
      const int h = (begin + at) / kRowPieces, d = (begin + at) % kRowPieces * 4;
      const uint2 bf = make_uint2(pack_bf16(v[i].x, v[i].y), pack_bf16(v[i].z, v[i].w));
      for (int r = 0; r < splits; ++r) {  // this CTA's own copy through its local address
        *reinterpret_cast<uint2*>(r == split ? q_at(h, d)
                                             : cluster.map_shared_rank(q_at(h, d), r)) = bf;
      }
    }
  }
}

// The first half of both kernels' prologue, one memory round trip: arrives at the cluster
// barrier (this CTA has started), loads the slots of the first kStages chunks (of kChunkTokens)
// and this CTA's share of q, stores q into every CTA of the cluster (q_at: the kernel's layout;
// kAsyncProxy: fenced for the async proxy, which reads it with wgmma), arrives again (release:
// this CTA's q stores are done), stages the checked slots into slots_s [kStages][kChunkTokens]
// (Slot: int64_t, or int32_t where the host has checked that the pool's capacity fits) and syncs
// the CTA.
// The caller waits on the cluster barrier (acquire) before it reads q.
template <int kHeads, int kThreads, int kStages, bool kAsyncProxy, int kChunkTokens = kChunk,
          class Rows, class Slot>
__device__ __forceinline__ void start_split(const SparseMlaParams& p, cg::cluster_group& cluster,
                                            const SplitPlan& plan, const CtaWork& w, Rows q_at,
                                            Slot* slots_s) {
  cluster_arrive_relaxed();  // this CTA has started: the others may write its q
  int64_t first_slots[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    const bool load = threadIdx.x < kChunkTokens && i < w.n_chunks;
    first_slots[i] =
        load ? raw_slot(p, w.indices, w.chunk0 + i, threadIdx.x, kChunkTokens) : int64_t(-1);
  }
  share_queries<kHeads, kThreads>(p, cluster, plan.splits, w.split, w.row, w.head0, w.heads, q_at);
  if constexpr (kAsyncProxy) fence_proxy_async_all();  // q's stores, in any CTA
  cluster_arrive_release();                            // this CTA's q stores are done
  if (threadIdx.x < kChunkTokens) {
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      slots_s[i * kChunkTokens + threadIdx.x] = Slot(checked_slot(p, first_slots[i]));
    }
  }
  __syncthreads();  // the staged slots are visible
}

// The weights of one head's splits, in place: m[s] (split s's max, log2 units, -inf when it saw
// no valid slot) becomes w_s = 2^(m_s - M) / L with M = max m_s and L = sum_s l_s 2^(m_s - M), in
// split order over the first `splits` entries. Returns the head's lse (natural log; -inf when no
// split saw a valid slot).
template <int kN>
__device__ __forceinline__ float split_weights(float (&m)[kN], const float (&l)[kN], int splits) {
  float m_max = -INFINITY;
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    if (s >= splits) break;
    m_max = fmaxf(m_max, m[s]);
  }
  float l_sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    if (s >= splits) break;
    m[s] = m[s] == -INFINITY ? 0.0f : exp2f(m[s] - m_max);  // the split's weight
    l_sum += l[s] * m[s];
  }
  const float inv = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    if (s >= splits) break;
    m[s] *= inv;
  }
  return l_sum > 0.0f ? (m_max + log2f(l_sum)) * 0.6931471805599453f : -INFINITY;
}

// The combine of the 256-thread kernels for kSplits splits: out = sum_s w_s o_s in split order
// over this CTA's slice of the output dims. Each head's kThreads / kHeads consecutive threads
// share it (4 in every kernel), so a thread loads its head's m and l from every split once and
// computes the weights itself (split_weights): no table of weights and no CTA barrier between
// the cluster barrier and the sums, and 2 remote loads of m and l per split per thread. Item k of
// a thread is the float4 at vec j + 4 k of its head's slice (j: the thread's place among the
// head's), so a warp's loads cover 8 heads' 64 consecutive bytes each. The remote loads of a
// group of items (64 registers of float4s) are issued before the first of their values is used:
// at 8 splits two round trips through the cluster. The head's first thread in split 0's CTA also
// writes lse. The arithmetic per output float is the fmaf chain in split order with the weights of
// split_weights, as in the mma.sync kernel's combine: the same bits, whatever thread does it.
// part(s, h, d): the 4 floats of split s's partial o at head h, output dims d..d + 3 (in this
// CTA's slice); ml(s, h, m, l): split s's m and l of head h.
template <class V, int kSplits, class Part, class Ml>
__device__ __forceinline__ void combine_slice(const SparseMlaParams& p, int split, int row,
                                              int head0, int heads, Part part, Ml ml) {
  static_assert(V::kThreads % V::kHeads == 0, "whole threads per head");
  constexpr int kTph = V::kThreads / V::kHeads;     // threads per head
  constexpr int kVecs = kKvLoraRank / kSplits / 4;  // float4s of a CTA's slice, per head
  static_assert(kVecs % kTph == 0);
  constexpr int kPer = kVecs / kTph;                         // items per thread
  constexpr int kWanted = kSplits >= 16 ? 1 : 16 / kSplits;  // 16 float4s of loads in flight
  constexpr int kGroup = kPer < kWanted ? kPer : kWanted;
  const int h = int(threadIdx.x) / kTph, j = int(threadIdx.x) % kTph;
  if (h >= heads) return;
  const int d0 = split * (kKvLoraRank / kSplits);
  // 16-byte stores when every output row keeps 16-byte alignment (the same values either way).
  const bool out_vec4 = (reinterpret_cast<uintptr_t>(p.out) & 15u) == 0 && p.ld_out % 4 == 0;
  float w[kSplits], l[kSplits];
#pragma unroll
  for (int s = 0; s < kSplits; ++s) ml(s, h, w[s], l[s]);
#pragma unroll
  for (int k0 = 0; k0 < kPer; k0 += kGroup) {
    float4 v[kGroup][kSplits];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const int d = d0 + (j + kTph * (k0 + k)) * 4;
#pragma unroll
      for (int s = 0; s < kSplits; ++s) v[k][s] = *reinterpret_cast<const float4*>(part(s, h, d));
    }
    if (k0 == 0) {
      const float lse = split_weights(w, l, kSplits);
      if (p.lse != nullptr && split == 0 && j == 0) p.lse[int64_t(row) * p.heads + head0 + h] = lse;
    }
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const int d = d0 + (j + kTph * (k0 + k)) * 4;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kSplits; ++s) {
        acc.x = fmaf(v[k][s].x, w[s], acc.x), acc.y = fmaf(v[k][s].y, w[s], acc.y);
        acc.z = fmaf(v[k][s].z, w[s], acc.z), acc.w = fmaf(v[k][s].w, w[s], acc.w);
      }
      float* out = p.out + int64_t(row) * p.ld_out + int64_t(head0 + h) * kKvLoraRank + d;
      if (out_vec4) {
        *reinterpret_cast<float4*>(out) = acc;
      } else {
        out[0] = acc.x, out[1] = acc.y, out[2] = acc.z, out[3] = acc.w;  // ld_out may be odd
      }
    }
  }
}
// combine_slice for the plan's split count (a power of two, split_plan).
template <class V, class Part, class Ml>
__device__ __forceinline__ void combine_slices(const SparseMlaParams& p, int splits, int split,
                                               int row, int head0, int heads, Part part, Ml ml) {
  switch (splits) {
    case 16:
      return combine_slice<V, 16>(p, split, row, head0, heads, part, ml);
    case 8:
      return combine_slice<V, 8>(p, split, row, head0, heads, part, ml);
    case 4:
      return combine_slice<V, 4>(p, split, row, head0, heads, part, ml);
    case 2:
      return combine_slice<V, 2>(p, split, row, head0, heads, part, ml);
    default:
      return combine_slice<V, 1>(p, split, row, head0, heads, part, ml);
  }
}

// The diagnostics trace of the warp-specialized kernels (SparseMlaParams::trace, the words of
// SparseMlaTrace, one row per CTA), written by one thread only when the pointer is set:
// trace_begin at the start, trace_stamp at each phase, trace_finish at the end (the SM, the
// CTA's chunks; a CTA with no chunk gets its first S at its prologue's end).
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void trace_stamp(const SparseMlaParams& p, int word) {
  p.trace[size_t(blockIdx.x) * SparseMlaTrace::kWords + word] = uint64_t(clock64());
}
__device__ __forceinline__ void trace_begin(const SparseMlaParams& p) {
  trace_stamp(p, SparseMlaTrace::kStart);
  p.trace[size_t(blockIdx.x) * SparseMlaTrace::kWords + SparseMlaTrace::kNsStart] = global_ns();
}
__device__ __forceinline__ void trace_finish(const SparseMlaParams& p, int n_chunks) {
  using T = SparseMlaTrace;
  trace_stamp(p, T::kEnd);
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  uint64_t* w = p.trace + size_t(blockIdx.x) * T::kWords;
  w[T::kNsEnd] = global_ns();
  w[T::kWhere] = uint64_t(sm) | uint64_t(uint32_t(n_chunks)) << 32;
  if (n_chunks == 0) w[T::kFirstS] = w[T::kPrologue];  // no S: the loops are empty
}

// The cluster's combine, after every CTA has left its partial in shared memory: part [kHeads]
// [kPartPitch] o (unnormalized), m [kHeads] (log2 units, -inf when the split saw no valid slot)
// and l [kHeads]. Per head, the weights of the splits (split_weights); over this CTA's slice of
// the output dims, out = sum_s w_s o_s in split order. The same order for every row, batch and
// variant.
// V: the kernel's variant (kHeads, kThreads, kSmem's m and l offsets, and coef for the mma.sync
// kernel); smem: the CTA's shared memory base, at the same offset in every CTA of the cluster,
// where part starts.
template <class V>
__device__ void combine_splits(const SparseMlaParams& p, cg::cluster_group& cluster, int splits,
                               int split, int row, int head0, int heads, uint8_t* smem) {
  // Split s's copy of an array at this offset of the shared memory: this CTA's own through its
  // local address, the others' through the cluster's.
  auto at = [&](int s, size_t offset) {
    float* local = reinterpret_cast<float*>(smem + offset);
    return s == split ? local : cluster.map_shared_rank(local, s);
  };
  auto ml = [&](int s, int h, float& m, float& l) {
    m = at(s, V::kSmem.m)[h];
    l = at(s, V::kSmem.l)[h];
  };
  if constexpr (V::kThreads >= 256) {  // the batched slices; the mma.sync kernel: the table
    combine_slices<V>(
        p, splits, split, row, head0, heads,
        [&](int s, int h, int d) -> const float* { return at(s, 0) + h * kPartPitch + d; }, ml);
  } else {
    // The mma.sync kernel's CTAs (64 to 256 threads, every register taken): per head h <
    // kHeads (threads 0..kHeads - 1), the weights into the table coef [kHeads][kMaxSplits], then
    // one item at a time, its splits' loads together (the batched slices spill there).
    auto* coef = reinterpret_cast<float*>(smem + V::kSmem.coef);
    if (threadIdx.x < V::kHeads) {
      const int h = threadIdx.x;
      float ms[kMaxSplits], ls[kMaxSplits];
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) {
        if (s < splits) ml(s, h, ms[s], ls[s]);
      }
      const float lse = split_weights(ms, ls, splits);
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) {
        if (s >= splits) break;
        coef[h * kMaxSplits + s] = ms[s];
      }
      if (p.lse != nullptr && split == 0 && h < heads) {
        p.lse[int64_t(row) * p.heads + head0 + h] = lse;
      }
    }
    __syncthreads();                            // coef is complete
    const int vecs = kKvLoraRank / splits / 4;  // float4s of this CTA's slice, per head
    const int d0 = split * (kKvLoraRank / splits);
    for (int it = threadIdx.x; it < V::kHeads * vecs; it += V::kThreads) {
      const int h = it / vecs, d = d0 + (it % vecs) * 4;
      if (h >= heads) continue;
      float4 v[kMaxSplits];
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) {
        if (s < splits) {
          const float* part = cluster.map_shared_rank(reinterpret_cast<float*>(smem), s);
          v[s] = *reinterpret_cast<const float4*>(part + h * kPartPitch + d);
        }
      }
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) {
        if (s >= splits) break;
        const float w = coef[h * kMaxSplits + s];
        acc.x = fmaf(v[s].x, w, acc.x), acc.y = fmaf(v[s].y, w, acc.y);
        acc.z = fmaf(v[s].z, w, acc.z), acc.w = fmaf(v[s].w, w, acc.w);
      }
      float* out = p.out + int64_t(row) * p.ld_out + int64_t(head0 + h) * kKvLoraRank + d;
      out[0] = acc.x, out[1] = acc.y, out[2] = acc.z, out[3] = acc.w;  // ld_out may be odd
    }
  }
}

// Whether every row of q (and each head's 576 floats in it) starts 16-byte aligned: the CTAs may
// then copy their heads' q from L2 with cp.async (the ws and hn kernels).
inline bool q_rows_aligned(const SparseMlaParams& p) {
  return (reinterpret_cast<uintptr_t>(p.q) & 15u) == 0 && p.ld_q % 4 == 0;
}

// The bound on splits per row: kDefaultSplits (4), or 1, 2, 8 or 16 with
// DSA_CUDA_SPARSE_MLA_MAX_SPLITS (read at every call; anything else: the default). It changes the
// split boundaries, so it changes the bits: set it for a whole process or not at all. 8 is the
// choice for latency at one or two rows (B = 1: 23 us against 32 in the bf16 kernel, 37 against
// 60 in the fp8 one). 1 is the other end: one CTA per row and head group, no cluster traffic (q
// from L2 by the CTA itself, no combine), the whole of a CTA's life in its token loop; at B = 64
// the launch is 128 CTAs, one wave, where 4 splits run 512 in five: on an H100 ws took 119.9 us
// at 1 split and 118.6 at 2 against 156.2 at 4, and 73.8 / 41.1 / 25.9 at B = 1
// (bench/results/2026-12-05-h100-mla.md). A deployment's choice, never the batch's.
inline int max_splits() {
  const char* v = std::getenv("DSA_CUDA_SPARSE_MLA_MAX_SPLITS");
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n == 1 || n == 2 || n == 4 || n == 8 || n == kMaxSplits ? n : kDefaultSplits;
}

// Heads per CTA of the 64-row wgmma kernels (wgmma, ws), 16, 32 or 64: the CTA's heads fill the
// tile's first rows, the rest stay zero in q and are never combined. By default (and with
// DSA_CUDA_SPARSE_MLA_HEADS=auto) the batch chooses: the fewest that still fit the launch in one
// wave of the GPU, else 64; =16|32|64 forces one (read at every call). A CTA's token loop costs
// the same with fewer heads, but its share of q's traffic and of the combine, the
// distributed-shared-memory traffic fixed per CTA (about 11 of a ws CTA's 28 us at B = 1 and 4
// splits, bench/results/2026-12-04-h200-mla-splits.md), shrinks with its heads; at small batches
// the extra CTAs run on SMs that would idle: ws at B = 1 took 27.9 us with 16 heads per CTA
// against 32.2 with 64 (4 splits, an H100, bench/results/2026-12-05-h100-mla.md). Heads are
// independent (S, the softmax, P V and the combine are per head), so any choice gives the same
// bits (SparseMlaWsHeadsPerCtaBitwise, SparseMlaWgmmaHeadsPerCtaBitwise,
// SparseMlaAutoHeadsInvariant).
constexpr bool kAutoHeadsByDefault = true;
// DSA_CUDA_SPARSE_MLA_HEADS as every sparse MLA launcher reads it (at every call): 16, 32 or 64
// forced; -1 for "auto"; 0 unset (or anything else, which the backend refuses when it is made).
inline int heads_knob() {
  const char* v = std::getenv("DSA_CUDA_SPARSE_MLA_HEADS");
  if (v == nullptr) return 0;
  if (std::strcmp(v, "auto") == 0) return -1;
  const int heads = std::atoi(v);
  return heads == 64 || heads == 32 || heads == 16 ? heads : 0;
}
// wave(): how many of the kernel's CTAs the device holds at once in clusters of plan.splits
// (wave_ctas), asked only when the batch chooses.
template <class Wave>
int heads_per_cta(const SparseMlaParams& p, const SplitPlan& plan, Wave&& wave) {
  const int knob = heads_knob();
  if (knob > 0) return knob;
  constexpr int kTileHeads = 64;
  if (knob == 0 && !kAutoHeadsByDefault) return kTileHeads;
  const int64_t capacity = wave();
  for (int heads : {16, 32}) {
    const int64_t ctas = int64_t(p.rows) * plan.splits * ((p.heads + heads - 1) / heads);
    if (ctas <= capacity) return heads;
  }
  return kTileHeads;
}

// The once-per-device state of one kernel instance: its opt-in (dynamic shared memory above 48
// KiB, clusters past the portable 8), whether one cluster of 16 fits on the GPU, and its wave
// per split count (wave_ctas; 0: not asked yet), per device.
struct LaunchOnce {
  std::atomic<uint64_t> opted_in{0}, asked{0}, fits{0};
  std::atomic<int> wave[64][5]{};  // [device % 64][log2 splits]
};
using SplitKernel = void (*)(SparseMlaParams, SplitPlan);

// The kernel's attributes, set once per device before its first launch or occupancy query.
inline cudaError_t prepare_split_kernel(SplitKernel kernel, size_t smem_bytes, LaunchOnce& once) {
  return once_per_device(once.opted_in, false, [&] {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes));
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  });
}

// How many CTAs of `kernel` run at once in clusters of `splits`: the wave one launch fills. A
// cluster's CTAs share one GPC, so with clusters this is below the SM count (4-CTA clusters of the
// ws kernel held 124 of the H200's 132 SMs, bench/results/2026-12-04-h200-mla-splits.md). Asked
// of the driver (cudaOccupancyMaxActiveClusters) once per device and split count; the SM count
// where it cannot say.
inline int wave_ctas(SplitKernel kernel, int splits, int threads, size_t smem_bytes,
                     LaunchOnce& once) {
  const int sms = device_sm_count() > 0 ? device_sm_count() : 132;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return sms;
  int level = 0;
  while ((1 << level) < splits && level < 4) ++level;
  std::atomic<int>& known = once.wave[device % 64][level];
  if (const int w = known.load(std::memory_order_relaxed); w > 0) return w;
  if (prepare_split_kernel(kernel, smem_bytes, once) != cudaSuccess) return sms;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(splits));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem_bytes;
  cudaLaunchAttribute cluster = cluster_dimension(unsigned(splits));
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess || clusters <= 0) {
    (void)cudaGetLastError();  // not sticky: the launch reports its own errors
    return sms;
  }
  known.store(clusters * splits, std::memory_order_relaxed);
  return clusters * splits;
}

// Launches `kernel` over rows * ceil(heads / heads_per_cta) * plan.splits CTAs of `threads`, in
// clusters of plan.splits (a row's head groups side by side, the splits of one (row, group) in
// one cluster). A cluster past the portable size that the GPU cannot place is refused with
// cudaErrorInvalidClusterSize and nothing launched (a launch that fails would be sticky in the
// worst case; this never is).
inline cudaError_t launch_split_clusters(SplitKernel kernel, const SparseMlaParams& p,
                                         const SplitPlan& plan, int heads_per_cta, int threads,
                                         size_t smem_bytes, cudaStream_t stream, LaunchOnce& once) {
  cudaError_t err = prepare_split_kernel(kernel, smem_bytes, once);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  const unsigned groups = unsigned((p.heads + heads_per_cta - 1) / heads_per_cta);
  config.gridDim = dim3(unsigned(p.rows) * groups * unsigned(plan.splits));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];  // the cluster's, and the programmatic launch's (pdl.h)
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = unsigned(plan.splits);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  if (plan.splits > kPortableSplits) {  // asked once per device
    int device = 0;
    err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const uint64_t bit = uint64_t(1) << (device % 64);
    if (!(once.asked.load(std::memory_order_relaxed) & bit)) {
      int clusters = 0;
      err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
      if (err != cudaSuccess) return err;
      if (clusters > 0) once.fits.fetch_or(bit, std::memory_order_relaxed);
      once.asked.fetch_or(bit, std::memory_order_relaxed);
    }
    if (!(once.fits.load(std::memory_order_relaxed) & bit)) return cudaErrorInvalidClusterSize;
  }
  add_pdl_attribute(config, attribute);  // after the occupancy query, which asks of clusters only
  err = cudaLaunchKernelEx(&config, kernel, p, plan);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

// The end of both kernels, once the token loop is done (no copy or wgmma in flight): the row
// sums over the quad, the split's partial into shared memory (o over q and the rings, which
// every warp is done with after the barrier) and the cluster's combine. The thread holds rows
// `row0` and row0 + 8 of the CTA's heads and, of each, 256 consecutive output dims starting at
// dim0 in the m16n8 C layout repeated: o[4 j + e] is row row0 + 8 (e / 2), dim dim0 + 8 j + e % 2
// (dim0 includes 2 (lane % 4)); writes_ml: this thread stores m and l of its rows. stamp(word):
// the diagnostics trace's hook (SparseMlaTrace::kParts once the partials are complete, kCombined
// once this CTA's slice is), a no-op but in the traced kernel.
struct NoStamp {
  __device__ void operator()(int) const {}
};
template <class V, class Stamp = NoStamp>
__device__ __forceinline__ void finish_split(const SparseMlaParams& p, cg::cluster_group& cluster,
                                             const SplitPlan& plan, const CtaWork& w, uint8_t* smem,
                                             const float (&o)[128], const float (&m)[2],
                                             float (&l)[2], int row0, int dim0, bool writes_ml,
                                             Stamp stamp = {}) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();
  auto* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = row0 + r * 8;
    float* dst = part + h * kPartPitch + dim0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
    }
    if (writes_ml) {
      reinterpret_cast<float*>(smem + V::kSmem.m)[h] = m[r];
      reinterpret_cast<float*>(smem + V::kSmem.l)[h] = l[r];
    }
  }
  cluster.sync();  // every split's partial is complete and visible to the cluster
  stamp(SparseMlaTrace::kParts);
  combine_splits<V>(p, cluster, plan.splits, w.split, w.row, w.head0, w.heads, smem);
  stamp(SparseMlaTrace::kCombined);
  // No CTA leaves while another still reads its shared memory. Relaxed: this CTA's remote loads
  // have all returned (their values are used above), and nothing it wrote is read after this.
  cluster_arrive_relaxed();
  cluster_wait_acquire();
}

}  // namespace dsa::cuda::sparse_mla_detail

namespace dsa::cuda {
// The heads-as-N kernel (sparse_mla_hn.cu; DSA_CUDA_SPARSE_MLA_VARIANT=hn), for small batches: its
// own bits, bf16 and fp8 caches (p already checked by sparse_mla()).
cudaError_t sparse_mla_hn(const SparseMlaParams& p, cudaStream_t stream);
}  // namespace dsa::cuda
