// The building blocks of the top-k kernels (topk.cu, the three-pass kernel; topk_gather.cu, the
// gathering kernel): the CPU's order as uint32 keys, block scans, shared-memory histograms and the
// radix select's narrowing, the ordered emit of the winners, the cluster merges through
// distributed shared memory, and the launch of one row per block or per cluster. The design of
// both kernels is in the header comments of their files.
#pragma once

#include <cooperative_groups.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/launch.h"
#include "dsa/slot.h"

namespace dsa::cuda::topk_detail {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 8;               // consecutive positions per thread per chunk
constexpr int kMaxBins = 2048;              // 11-bit digits
constexpr int kCandidateCap = 8192;         // keys of the pass-1 bin kept in shared memory
constexpr int kSlices = 8;                  // blocks per row in the cluster kernel
constexpr int64_t kSliceMinLogits = 16384;  // ld_logits from which rows are sliced
// Slicing pays only while the clusters fit one wave (two blocks per SM): 32 rows x 8 blocks = 256
// blocks on the H200's 132 SMs. Past that the one-block kernel keeps every SM busy without the
// cluster barriers (H200, 2026-12-03: top-2048 of L = 32K at B = 64 is 38.7 us unsliced against
// 84.5 us sliced; at B = 1 24.1 us sliced against 37.3 us). The choice can depend on the row
// count because both kernels give the exact, identical result.
constexpr int kMaxSlicedRows = 32;

// The total order of the CPU reference as an unsigned key: larger key ranks higher.
__device__ __forceinline__ uint32_t rank_key(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0u;  // NaN: below every number
  if (u == 0x80000000u) u = 0u;                    // -0 ranks equal to +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct TopkShared {
  uint32_t hist[kMaxBins];
  uint32_t candidates[kCandidateCap];
  uint32_t warp_sums[kWarps];
  uint32_t candidate_count;
  uint32_t found_bin, found_above, found_count;
  uint32_t slice_gt, slice_eq;  // cluster kernel: the counts of this block's slice
};

// Exclusive prefix sum of v in thread order over a block of kT threads; `total` gets the block's
// sum. All threads call it.
template <int kT = kThreads>
__device__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* warp_sums, uint32_t& total) {
  constexpr int kScanWarps = kT / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    uint32_t s = lane < kScanWarps ? warp_sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    if (lane < kScanWarps) warp_sums[lane] = s;
  }
  __syncthreads();
  const uint32_t before = (warp > 0 ? warp_sums[warp - 1] : 0u) + x - v;
  total = warp_sums[kScanWarps - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return before;
}

// Keys of positions [t, t + kPerThread); positions >= n get key 0 (callers mask them by t < n).
__device__ __forceinline__ void load_keys(const float* row, bool aligned, int64_t t, int64_t n,
                                          uint32_t (&key)[kPerThread]) {
  if (aligned && t + kPerThread <= n) {
#pragma unroll
    for (int v = 0; v < kPerThread / 4; ++v) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(row + t) + v);
      key[4 * v] = rank_key(x.x), key[4 * v + 1] = rank_key(x.y);
      key[4 * v + 2] = rank_key(x.z), key[4 * v + 3] = rank_key(x.w);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) key[j] = t + j < n ? rank_key(__ldg(row + t + j)) : 0u;
}

// The state of the radix select: keys with (key & mask) == prefix are still candidates, and
// k_rem of them are winners.
struct Selection {
  uint32_t prefix = 0, mask = 0;
  uint32_t k_rem = 0;
};

// After hist holds the counts of one digit (nbins bins), finds the bin holding the k_rem-th
// largest candidate, narrows the selection to it and returns how many candidates it holds.
template <int kT = kThreads, typename Shared>
__device__ uint32_t narrow(Shared& s, int nbins, int shift, Selection& sel) {
  const int per = nbins / kT;  // bins per thread, visited from the top bin down
  uint32_t local = 0;
  for (int j = 0; j < per; ++j) local += s.hist[nbins - 1 - (threadIdx.x * per + j)];
  uint32_t total;
  uint32_t run = block_exclusive_scan<kT>(local, s.warp_sums, total);
  for (int j = 0; j < per; ++j) {
    const int bin = nbins - 1 - (threadIdx.x * per + j);
    const uint32_t c = s.hist[bin];
    if (run < sel.k_rem && sel.k_rem <= run + c) {
      s.found_bin = bin, s.found_above = run, s.found_count = c;
    }
    run += c;
  }
  __syncthreads();
  sel.prefix |= s.found_bin << shift;
  sel.mask |= uint32_t(nbins - 1) << shift;
  sel.k_rem -= s.found_above;
  const uint32_t count = s.found_count;
  __syncthreads();  // found_* and hist are reused
  return count;
}

template <int kT = kThreads, typename Shared>
__device__ void clear_hist(Shared& s) {
  for (int i = threadIdx.x; i < kMaxBins; i += kT) s.hist[i] = 0;
  __syncthreads();
}

// One histogram pass over positions [begin, end) of the row in global memory; optionally gathers
// the candidates' keys. Two chunks are loaded before either is counted, to keep more bytes in
// flight per block (kUnroll chunks). begin is a multiple of 8.
template <int kT = kThreads, int kUnroll = 2, typename Shared>
__device__ void global_pass(Shared& s, const float* row, bool aligned, int64_t begin, int64_t end,
                            int shift, int nbins, const Selection& sel, bool gather) {
  constexpr int kStep = kT * kPerThread;
  for (int64_t base = begin; base < end; base += kUnroll * kStep) {
    uint32_t key[kUnroll][kPerThread];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      load_keys(row, aligned, base + u * kStep + threadIdx.x * kPerThread, end, key[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = base + u * kStep + threadIdx.x * kPerThread;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        if (t + j >= end || (key[u][j] & sel.mask) != sel.prefix) continue;
        atomicAdd(&s.hist[(key[u][j] >> shift) & uint32_t(nbins - 1)], 1u);
        if (gather) s.candidates[atomicAdd(&s.candidate_count, 1u)] = key[u][j];
      }
    }
  }
  __syncthreads();
}

template <int kT = kThreads, typename Shared>
__device__ void shared_pass(Shared& s, int shift, int nbins, const Selection& sel) {
  for (uint32_t i = threadIdx.x; i < s.candidate_count; i += kT) {
    const uint32_t key = s.candidates[i];
    if ((key & sel.mask) != sel.prefix) continue;
    atomicAdd(&s.hist[(key >> shift) & uint32_t(nbins - 1)], 1u);
  }
  __syncthreads();
}

// Writes output index i of the row: position t, and its slot when asked for.
__device__ __forceinline__ void emit(const TopkParams& p, int row, int i, int32_t t) {
  p.out_positions[int64_t(row) * p.k + i] = t;
  if (p.out_slots == nullptr) return;
  int64_t slot = kPadSlot;
  if (t >= 0) {
    const int32_t page = p.page_table[int64_t(row) * p.ld_page_table + t / kPageSize];
    slot = int64_t(page) * kPageSize + t % kPageSize;
  }
  p.out_slots[int64_t(row) * p.k + i] = slot;
}

// The ordered scan: every key > thr, then the first take_eq keys == thr, in ascending t. Each
// thread owns kPerThread consecutive positions of a chunk; the scan stops once k are placed.
// Positions [begin, end) of the row; base_gt and base_eq count the keys > thr and == thr before
// begin. An index never reaches k: thr is the k-th largest key, so the keys > thr number at most
// k - take_eq.
template <int kT = kThreads, typename Shared>
__device__ void emit_winners(const TopkParams& p, Shared& s, int row, const float* row_ptr,
                             bool aligned, int64_t begin, int64_t end, uint32_t thr,
                             uint32_t take_eq, uint32_t base_gt, uint32_t base_eq) {
  for (int64_t chunk = begin; chunk < end; chunk += kT * kPerThread) {
    if (base_gt + min(base_eq, take_eq) >= uint32_t(p.k)) break;  // block-uniform
    const int64_t t = chunk + int64_t(threadIdx.x) * kPerThread;
    uint32_t key[kPerThread];
    load_keys(row_ptr, aligned, t, end, key);
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const bool in = t + j < end;
      gt += in && key[j] > thr;
      eq += in && key[j] == thr;
    }
    uint32_t total;
    const uint32_t before = block_exclusive_scan<kT>(gt | (eq << 16), s.warp_sums, total);
    uint32_t gt_before = base_gt + (before & 0xFFFFu), eq_before = base_eq + (before >> 16);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (t + j >= end) break;
      if (key[j] > thr) {
        emit(p, row, int(gt_before + min(eq_before, take_eq)), int32_t(t + j));
        ++gt_before;
      } else if (key[j] == thr) {
        if (eq_before < take_eq) emit(p, row, int(gt_before + eq_before), int32_t(t + j));
        ++eq_before;
      }
    }
    base_gt += total & 0xFFFFu;
    base_eq += total >> 16;
  }
}

// Sums every block's histogram of the cluster (kRanks blocks of kT threads) into each block's
// own, bins [0, nbins). The loop is unrolled by 4, so remote loads are in flight together.
template <int kT = kThreads, int kRanks = kSlices, typename Shared>
__device__ void merge_hist(Shared& s, int nbins) {
  cg::cluster_group cluster = cg::this_cluster();
  constexpr int kPer = kMaxBins / kT;
  uint32_t sum[kPer] = {};
  cluster.sync();  // every block's histogram is complete
#pragma unroll 4
  for (int r = 0; r < kRanks; ++r) {
    const uint32_t* h = cluster.map_shared_rank(s.hist, unsigned(r));
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int bin = threadIdx.x + j * kT;
      if (bin < nbins) sum[j] += h[bin];
    }
  }
  cluster.sync();  // every block is done reading the others' histograms
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = threadIdx.x + j * kT;
    if (bin < nbins) s.hist[bin] = sum[j];
  }
  __syncthreads();
}

// The keys > thr and == thr in positions [begin, end), to every thread of the block.
template <int kT = kThreads, typename Shared>
__device__ void count_slice(Shared& s, const float* row_ptr, bool aligned, int64_t begin,
                            int64_t end, uint32_t thr, uint32_t& gt, uint32_t& eq) {
  uint32_t my_gt = 0, my_eq = 0;
  for (int64_t chunk = begin; chunk < end; chunk += kT * kPerThread) {
    const int64_t t = chunk + int64_t(threadIdx.x) * kPerThread;
    uint32_t key[kPerThread];
    load_keys(row_ptr, aligned, t, end, key);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const bool in = t + j < end;
      my_gt += in && key[j] > thr;
      my_eq += in && key[j] == thr;
    }
  }
  block_exclusive_scan<kT>(my_gt, s.warp_sums, gt);
  block_exclusive_scan<kT>(my_eq, s.warp_sums, eq);
}

// The counts of keys > thr and == thr in the slices of the blocks ranked below `rank` of the
// cluster, from this block's own (gt, eq), which every thread holds.
template <typename Shared>
__device__ void slices_before(Shared& s, int rank, uint32_t gt, uint32_t eq, uint32_t& base_gt,
                              uint32_t& base_eq) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) s.slice_gt = gt, s.slice_eq = eq;
  cluster.sync();  // every block's counts are published
  for (int r = 0; r < rank; ++r) {
    base_gt += cluster.map_shared_rank(&s.slice_gt, unsigned(r))[0];
    base_eq += cluster.map_shared_rank(&s.slice_eq, unsigned(r))[0];
  }
  cluster.sync();  // no block leaves while another still reads its counts
}

// The launch of rows * ranks blocks of `threads`, in clusters of `ranks` when > 1; `cluster`
// holds the attribute that config points to.
inline void row_launch_config(cudaLaunchConfig_t& config, cudaLaunchAttribute& cluster,
                              const TopkParams& p, int ranks, int threads, size_t smem,
                              cudaStream_t stream) {
  config = {};
  config.gridDim = dim3(unsigned(p.rows) * unsigned(ranks));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = unsigned(ranks);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = ranks > 1 ? 1 : 0;
}

inline cudaError_t launch_rows(void (*kernel)(TopkParams), const TopkParams& p, int ranks,
                               int threads, size_t smem, cudaStream_t stream) {
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attrs[2];  // the cluster's, and the programmatic launch's (pdl.h)
  row_launch_config(config, attrs[0], p, ranks, threads, smem, stream);
  add_pdl_attribute(config, attrs);
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, p);
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

// The gathering kernel (topk_gather.cu) for k up to 4096 when one of its variants fits the
// device: sets `err` to the launch's status and returns true; false when it does not apply.
bool topk_gather(const TopkParams& p, cudaStream_t stream, cudaError_t& err);

}  // namespace dsa::cuda::topk_detail
