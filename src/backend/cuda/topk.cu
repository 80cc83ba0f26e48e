// Top-k over the indexer's logits (DESIGN §1.6), identical to the CPU's sets and order.
//
// One block of 512 threads per row (two fit an SM), or, for long rows (ld_logits >= 16384) in
// batches of at most 32 rows, a cluster of 8 such blocks per row, each owning a slice of the row.
// The CPU's strict total order (numbers above NaN, larger value first, -0 == +0, then lower
// position first) is an order on uint32 keys: rank_key() maps floats monotonically, every NaN to 0
// (below -inf) and -0 to +0, and equal keys are broken by position. So the k winners are every t
// with key > thr plus the first (k
// - count_gt) positions with key == thr, where thr is the k-th largest key.
//
//   1. Radix select finds thr in three passes of 11, 11 and 10 bits with shared-memory
//      histograms. The second pass also gathers the keys of the chosen 11-bit bin into shared
//      memory when they fit, so the third pass reads no global memory.
//   2. An ordered scan over t (chunks of 4096, block-wide exclusive scan of the packed counts
//      of > thr and == thr) gives each winner its output index directly: the output is in
//      ascending position order with no sort. The scan stops once k winners are placed.
// In a cluster, each block histograms its slice and the blocks sum the 8 histograms through
// distributed shared memory after every pass, so every block takes the same (exact) decisions;
// for the scan, each block counts the > thr and == thr keys of its slice first and starts from
// the counts of the slices before it. Counts are integers and every decision depends on the
// row alone, so either way the op is exact, batch-invariant and deterministic.
//
// That is the legacy kernel (DSA_CUDA_TOPK=legacy, and k > 4096). The default, topk_gather_kernel,
// reads the row twice instead of three times and holds the rest in shared memory:
//   1. An 11-bit histogram of the top digit (1024 threads, coalesced 16-byte loads) finds the
//      threshold's bin b.
//   2. One ordered pass gathers, in ascending position, the positions of every key whose digit is
//      above b (certain winners, fewer than k) and the keys and positions of the keys in bin b
//      (candidates, at most 16384; a bin that holds more takes the legacy passes from global
//      memory instead). A block scan per step of 8192 positions gives each its index.
//   3. Two radix passes over the candidates in shared memory find thr and the ties to take.
//   4. Each winner's output index is the count of winners before it: its rank in its own list
//      plus a binary search in the other (both lists are in position order).
// Rows are split over a cluster of 1, 2, 4 or 8 CTAs when the batch leaves SMs idle; the slices'
// histograms are summed through distributed shared memory as in the legacy kernel. The split
// depends on the batch, the result does not: every variant computes the same exact selection.
#include <cooperative_groups.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/launch.h"
#include "dsa/slot.h"

namespace dsa::cuda {
namespace {

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

// kSliced: launched in clusters of kSlices blocks per row, block r of a row owning positions
// [r * slice, (r + 1) * slice) of it. Otherwise one block per row.
template <bool kSliced>
__global__ void __launch_bounds__(kThreads, 2) topk_kernel(TopkParams p) {
  const int row = kSliced ? blockIdx.x / kSlices : blockIdx.x;
  int64_t n = p.seq_lens[row];
  n = n < 0 ? 0 : (n > p.ld_logits ? p.ld_logits : n);
  const int rank = kSliced ? int(blockIdx.x % kSlices) : 0;
  const int blocks = kSliced ? kSlices : 1;
  if (n <= p.k) {  // every position is taken, in order, then -1
    for (int i = rank * kThreads + threadIdx.x; i < p.k; i += blocks * kThreads) {
      emit(p, row, i, i < n ? i : -1);
    }
    return;  // the same branch in every block of the row: no cluster barrier is left waiting
  }
  __shared__ TopkShared s;
  const float* row_ptr = p.logits + int64_t(row) * p.ld_logits;
  const bool aligned = (reinterpret_cast<uintptr_t>(row_ptr) & 15u) == 0;
  // This block's positions; slices start at multiples of 8 (16-byte loads stay aligned).
  const int64_t slice = ((n + blocks - 1) / blocks + 7) / 8 * 8;
  const int64_t begin = min(n, rank * slice), end = min(n, begin + slice);
  if (threadIdx.x == 0) s.candidate_count = 0;
  Selection sel;
  sel.k_rem = uint32_t(p.k);
  auto merge = [&](int nbins) {
    if constexpr (kSliced) merge_hist(s, nbins);
  };

  clear_hist(s);
  global_pass(s, row_ptr, aligned, begin, end, 21, 2048, sel, false);
  merge(2048);
  // The merged count bounds every block's own candidates: the same choice in every block.
  const bool gather = narrow(s, 2048, 21, sel) <= uint32_t(kCandidateCap);
  clear_hist(s);
  global_pass(s, row_ptr, aligned, begin, end, 10, 2048, sel, gather);
  merge(2048);
  narrow(s, 2048, 10, sel);
  clear_hist(s);
  if (gather) {
    shared_pass(s, 0, 1024, sel);
  } else {
    global_pass(s, row_ptr, aligned, begin, end, 0, 1024, sel, false);
  }
  merge(1024);
  narrow(s, 1024, 0, sel);
  // sel.prefix is now the k-th largest key and sel.k_rem the ties at it to take.
  uint32_t base_gt = 0, base_eq = 0;
  if constexpr (kSliced) {
    uint32_t gt, eq;
    count_slice(s, row_ptr, aligned, begin, end, sel.prefix, gt, eq);
    slices_before(s, rank, gt, eq, base_gt, base_eq);
  }
  emit_winners(p, s, row, row_ptr, aligned, begin, end, sel.prefix, sel.k_rem, base_gt, base_eq);
}

// ---- the gathering kernel ----------------------------------------------------------------------

constexpr int kGThreads = 1024;
constexpr int kGPerThread = 8;                   // consecutive positions per thread per step
constexpr int kGStep = kGThreads * kGPerThread;  // 8192 positions per ordered step (< 2^16)
constexpr int kGVec = 4;                         // float4 loads per thread per histogram step
constexpr int kGCandidateCap = 16384;            // keys of the threshold's bin held in shared
constexpr int kGMaxK = 4096;                     // certain winners held in shared (< k)
constexpr int64_t kGMinSlice = 4096;             // positions per CTA below which rows stay whole

struct GatherShared {
  uint32_t hist[kMaxBins];
  uint32_t warp_sums[kGThreads / 32];
  uint32_t found_bin, found_above, found_count;
  uint32_t slice_gt, slice_eq;
  uint32_t candidate_count;
  int32_t winner_pos[kGMaxK];             // certain winners' positions, ascending
  int32_t candidate_pos[kGCandidateCap];  // candidates' positions, ascending
  // The candidates' keys; at the end, each one's count of selected candidates before it, with
  // bit 31 set where it is selected itself.
  uint32_t candidates[kGCandidateCap];
};

constexpr size_t kGSharedBytes = sizeof(GatherShared);

// Pass 1: the histogram of the top 11 bits of the keys of positions [begin, end). Thread i reads
// float4 i, i + kGThreads, ... of each step (coalesced); order does not matter for counts.
__device__ void top_digit_histogram(GatherShared& s, const float* row, bool aligned, int64_t begin,
                                    int64_t end) {
  constexpr int kVec = kGVec, kHistStep = kGThreads * kVec * 4;
  int64_t base = begin;
  if (aligned) {
    for (; base + kHistStep <= end; base += kHistStep) {
      const float4* r4 = reinterpret_cast<const float4*>(row + base);
      float4 x[kVec];
#pragma unroll
      for (int v = 0; v < kVec; ++v) x[v] = __ldg(r4 + v * kGThreads + threadIdx.x);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        atomicAdd(&s.hist[rank_key(x[v].x) >> 21], 1u);
        atomicAdd(&s.hist[rank_key(x[v].y) >> 21], 1u);
        atomicAdd(&s.hist[rank_key(x[v].z) >> 21], 1u);
        atomicAdd(&s.hist[rank_key(x[v].w) >> 21], 1u);
      }
    }
  }
  for (int64_t t = base + threadIdx.x; t < end; t += kGThreads) {
    atomicAdd(&s.hist[rank_key(__ldg(row + t)) >> 21], 1u);
  }
  __syncthreads();
}

// Pass 2: in ascending position over [begin, end), appends every key whose top digit is above
// `bin` to winner_pos and every key in `bin` to the candidates. Returns the two counts.
__device__ void gather_ordered(GatherShared& s, const float* row, bool aligned, int64_t begin,
                               int64_t end, uint32_t bin, uint32_t& winners, uint32_t& candidates) {
  winners = 0, candidates = 0;
  static_assert(kGPerThread == kPerThread, "load_keys reads kPerThread positions");
  // The next step's keys are loaded before this step's scan: their latency overlaps it.
  uint32_t key[kPerThread], next[kPerThread];
  load_keys(row, aligned, begin + int64_t(threadIdx.x) * kGPerThread, end, next);
  for (int64_t base = begin; base < end; base += kGStep) {
    const int64_t t = base + int64_t(threadIdx.x) * kGPerThread;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) key[j] = next[j];
    if (base + kGStep < end) load_keys(row, aligned, t + kGStep, end, next);  // block-uniform
    // Positions >= end are masked below.
    uint32_t above = 0, in_bin = 0;
#pragma unroll
    for (int j = 0; j < kGPerThread; ++j) {
      const bool in = t + j < end;
      above += in && (key[j] >> 21) > bin;
      in_bin += in && (key[j] >> 21) == bin;
    }
    uint32_t total;
    const uint32_t before =
        block_exclusive_scan<kGThreads>(above | (in_bin << 16), s.warp_sums, total);
    uint32_t w = winners + (before & 0xFFFFu), c = candidates + (before >> 16);
#pragma unroll
    for (int j = 0; j < kGPerThread; ++j) {
      if (t + j >= end) break;
      const uint32_t d = key[j] >> 21;
      if (d > bin) {
        s.winner_pos[w++] = int32_t(t + j);
      } else if (d == bin) {
        s.candidates[c] = key[j];
        s.candidate_pos[c++] = int32_t(t + j);
      }
    }
    winners += total & 0xFFFFu;
    candidates += total >> 16;
  }
  __syncthreads();
}

// The number of entries of the ascending list a[0, n) below t.
__device__ __forceinline__ uint32_t count_below(const int32_t* a, uint32_t n, int32_t t) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (a[mid] < t) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// kRanks CTAs per row (a cluster when > 1), CTA r owning positions [r * slice, (r + 1) * slice).
template <int kRanks>
__global__ void __launch_bounds__(kGThreads, 1) topk_gather_kernel(TopkParams p) {
  constexpr bool kSliced = kRanks > 1;
  const int row = blockIdx.x / kRanks;
  const int rank = int(blockIdx.x % kRanks);
  int64_t n = p.seq_lens[row];
  n = n < 0 ? 0 : (n > p.ld_logits ? p.ld_logits : n);
  if (n <= p.k) {  // every position is taken, in order, then -1
    for (int i = rank * kGThreads + threadIdx.x; i < p.k; i += kRanks * kGThreads) {
      emit(p, row, i, i < n ? i : -1);
    }
    return;  // the same branch in every CTA of the row: no cluster barrier is left waiting
  }
  extern __shared__ __align__(16) unsigned char smem_raw[];
  GatherShared& s = *reinterpret_cast<GatherShared*>(smem_raw);
  const float* row_ptr = p.logits + int64_t(row) * p.ld_logits;
  const bool aligned = (reinterpret_cast<uintptr_t>(row_ptr) & 15u) == 0;
  // Slices start at multiples of 16 positions (16-byte loads stay aligned).
  const int64_t slice = ((n + kRanks - 1) / kRanks + 15) / 16 * 16;
  const int64_t begin = min(n, rank * slice), end = min(n, begin + slice);
  auto merge = [&](int nbins) {
    if constexpr (kSliced) merge_hist<kGThreads, kRanks>(s, nbins);
  };
  Selection sel;
  sel.k_rem = uint32_t(p.k);

  clear_hist<kGThreads>(s);
  top_digit_histogram(s, row_ptr, aligned, begin, end);
  merge(2048);
  // The merged count bounds every CTA's own candidates: the same choice in every CTA.
  const bool gather = narrow<kGThreads>(s, 2048, 21, sel) <= uint32_t(kGCandidateCap);
  uint32_t base_gt = 0, base_eq = 0;
  if (!gather) {  // the legacy passes from global memory, then its ordered emit
    clear_hist<kGThreads>(s);
    global_pass<kGThreads, 1>(s, row_ptr, aligned, begin, end, 10, 2048, sel, false);
    merge(2048);
    narrow<kGThreads>(s, 2048, 10, sel);
    clear_hist<kGThreads>(s);
    global_pass<kGThreads, 1>(s, row_ptr, aligned, begin, end, 0, 1024, sel, false);
    merge(1024);
    narrow<kGThreads>(s, 1024, 0, sel);
    if constexpr (kSliced) {
      uint32_t gt, eq;
      count_slice<kGThreads>(s, row_ptr, aligned, begin, end, sel.prefix, gt, eq);
      slices_before(s, rank, gt, eq, base_gt, base_eq);
    }
    emit_winners<kGThreads>(p, s, row, row_ptr, aligned, begin, end, sel.prefix, sel.k_rem, base_gt,
                            base_eq);
    return;
  }
  uint32_t winners, candidates;
  gather_ordered(s, row_ptr, aligned, begin, end, sel.prefix >> 21, winners, candidates);
  if (threadIdx.x == 0) s.candidate_count = candidates;
  clear_hist<kGThreads>(s);  // its barrier also publishes candidate_count
  shared_pass<kGThreads>(s, 10, 2048, sel);
  merge(2048);
  narrow<kGThreads>(s, 2048, 10, sel);
  clear_hist<kGThreads>(s);
  shared_pass<kGThreads>(s, 0, 1024, sel);
  merge(1024);
  narrow<kGThreads>(s, 1024, 0, sel);
  const uint32_t thr = sel.prefix, take_eq = sel.k_rem;

  // Each thread owns a run of consecutive candidates: count > thr and == thr, scan them.
  const uint32_t per = (candidates + kGThreads - 1) / kGThreads;
  const uint32_t c0 = min(candidates, threadIdx.x * per), c1 = min(candidates, c0 + per);
  uint32_t gt = 0, eq = 0;
  for (uint32_t c = c0; c < c1; ++c) {
    gt += s.candidates[c] > thr;
    eq += s.candidates[c] == thr;
  }
  uint32_t total;
  const uint32_t before = block_exclusive_scan<kGThreads>(gt | (eq << 16), s.warp_sums, total);
  const uint32_t slice_gt = winners + (total & 0xFFFFu), slice_eq = total >> 16;
  if constexpr (kSliced) slices_before(s, rank, slice_gt, slice_eq, base_gt, base_eq);
  // Winners in the slices before this one, and the ties they took.
  const uint32_t eq_taken = min(base_eq, take_eq);
  const uint32_t out_base = base_gt + eq_taken;
  // Each candidate's count of selected candidates before it in this slice (bit 31: selected).
  uint32_t gt_before = before & 0xFFFFu, eq_before = before >> 16;
  for (uint32_t c = c0; c < c1; ++c) {
    const uint32_t key = s.candidates[c];
    const uint32_t selected_before = gt_before + min(base_eq + eq_before, take_eq) - eq_taken;
    const bool selected = key > thr || (key == thr && base_eq + eq_before < take_eq);
    s.candidates[c] = selected_before | (selected ? 0x80000000u : 0u);
    gt_before += key > thr;
    eq_before += key == thr;
  }
  const uint32_t selected_total = (total & 0xFFFFu) + min(base_eq + slice_eq, take_eq) - eq_taken;
  __syncthreads();  // every candidate's count is written
  for (uint32_t i = threadIdx.x; i < winners; i += kGThreads) {
    const int32_t t = s.winner_pos[i];
    const uint32_t c = count_below(s.candidate_pos, candidates, t);
    const uint32_t selected_before =
        c < candidates ? (s.candidates[c] & 0x7FFFFFFFu) : selected_total;
    emit(p, row, int(out_base + i + selected_before), t);
  }
  for (uint32_t c = threadIdx.x; c < candidates; c += kGThreads) {
    const uint32_t v = s.candidates[c];
    if ((v >> 31) == 0) continue;
    const int32_t t = s.candidate_pos[c];
    emit(p, row, int(out_base + (v & 0x7FFFFFFFu) + count_below(s.winner_pos, winners, t)), t);
  }
}

// CTAs per row for the gathering kernel: the most (up to 8) that keeps the grid within the SMs
// and every slice at kGMinSlice positions or more.
int gather_ranks(const TopkParams& p) {
  const int sms = device_sm_count();
  int ranks = 1;
  while (ranks < 8 && int64_t(p.rows) * ranks * 2 <= sms &&
         p.ld_logits / (ranks * 2) >= kGMinSlice) {
    ranks *= 2;
  }
  return ranks;
}

// The launch of rows * ranks blocks of `threads`, in clusters of `ranks` when > 1; `cluster`
// holds the attribute that config points to.
void row_launch_config(cudaLaunchConfig_t& config, cudaLaunchAttribute& cluster,
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

cudaError_t launch_rows(void (*kernel)(TopkParams), const TopkParams& p, int ranks, int threads,
                        size_t smem, cudaStream_t stream) {
  cudaLaunchConfig_t config;
  cudaLaunchAttribute cluster;
  row_launch_config(config, cluster, p, ranks, threads, smem, stream);
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, p);
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

// Whether a cluster of kRanks gathering CTAs (1024 threads and ~156 KB each, one per SM) can be
// resident on the current device. Asked once per device, with the kernel's dynamic shared memory
// attribute set first (it stays set for every later launch on that device).
template <int kRanks>
bool gather_fits(const TopkParams& p) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};  // 0: not asked, 1: fits, 2: does not
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < kMaxDevices && known[device] != 0) return known[device] == 1;
  bool fits =
      cudaFuncSetAttribute(topk_gather_kernel<kRanks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kGSharedBytes)) == cudaSuccess;
  if (fits && kRanks > 1) {
    cudaLaunchConfig_t config;
    cudaLaunchAttribute cluster;
    row_launch_config(config, cluster, p, kRanks, kGThreads, kGSharedBytes, nullptr);
    int clusters = 0;
    fits = cudaOccupancyMaxActiveClusters(&clusters, topk_gather_kernel<kRanks>, &config) ==
               cudaSuccess &&
           clusters > 0;
  }
  if (!fits) (void)cudaGetLastError();  // a refused question leaves no error behind
  if (device < kMaxDevices) known[device] = fits ? 1 : 2;
  return fits;
}

template <int kRanks>
cudaError_t launch_gather(const TopkParams& p, cudaStream_t stream) {
  return launch_rows(topk_gather_kernel<kRanks>, p, kRanks, kGThreads, kGSharedBytes, stream);
}

// DSA_CUDA_TOPK=legacy selects the three-pass kernels (for comparisons); read at every call.
bool legacy_requested() {
  const char* v = std::getenv("DSA_CUDA_TOPK");
  return v != nullptr && std::strcmp(v, "legacy") == 0;
}

cudaError_t launch_legacy(const TopkParams& p, cudaStream_t stream) {
  if (p.ld_logits < kSliceMinLogits || p.rows > kMaxSlicedRows) {
    return launch_rows(topk_kernel<false>, p, 1, kThreads, 0, stream);
  }
  // Long rows: a cluster of kSlices blocks per row (the result is exact either way).
  return launch_rows(topk_kernel<true>, p, kSlices, kThreads, 0, stream);
}

}  // namespace

cudaError_t topk(const TopkParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.k <= 0 || (p.out_slots != nullptr && p.page_table == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.k > kGMaxK || legacy_requested()) return launch_legacy(p, stream);
  // Fewer CTAs per row where a cluster would not fit (the result is the same).
  const int ranks = gather_ranks(p);
  if (ranks >= 8 && gather_fits<8>(p)) return launch_gather<8>(p, stream);
  if (ranks >= 4 && gather_fits<4>(p)) return launch_gather<4>(p, stream);
  if (ranks >= 2 && gather_fits<2>(p)) return launch_gather<2>(p, stream);
  if (!gather_fits<1>(p)) return launch_legacy(p, stream);
  return launch_gather<1>(p, stream);
}

}  // namespace dsa::cuda
