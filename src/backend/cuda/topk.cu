// Top-k over the indexer's logits (DESIGN §1.6), identical to the CPU's sets and order.
//
// One block of 512 threads per row (two fit an SM). The CPU's strict total order (numbers above
// NaN, larger value first, -0 == +0, then lower position first) is an order on uint32 keys:
// rank_key() maps floats monotonically, every NaN to 0 (below -inf) and -0 to +0, and equal keys
// are broken by position. So the k winners are every t with key > thr plus the first
// (k - count_gt) positions with key == thr, where thr is the k-th largest key.
//
//   1. Radix select finds thr in three passes of 11, 11 and 10 bits with shared-memory
//      histograms. The second pass also gathers the keys of the chosen 11-bit bin into shared
//      memory when they fit, so the third pass reads no global memory.
//   2. An ordered scan over t (chunks of 4096, block-wide exclusive scan of the packed counts
//      of > thr and == thr) gives each winner its output index directly: the output is in
//      ascending position order with no sort. The scan stops once k winners are placed.
// Every decision depends on the row alone, so the op is batch-invariant and deterministic.
#include <cstdint>

#include "backend/cuda/launch.h"
#include "dsa/slot.h"

namespace dsa::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 8;                       // consecutive positions per thread per chunk
constexpr int kChunk = kThreads * kPerThread;       // 4096 positions per scan step (< 2^16)
constexpr int kMaxBins = 2048;                      // 11-bit digits
constexpr int kCandidateCap = 8192;                 // keys of the pass-1 bin kept in shared memory

// The total order of the CPU reference as an unsigned key: larger key ranks higher.
__device__ __forceinline__ uint32_t rank_key(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0u;  // NaN: below every number
  if (u == 0x80000000u) u = 0u;                     // -0 ranks equal to +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct TopkShared {
  uint32_t hist[kMaxBins];
  uint32_t candidates[kCandidateCap];
  uint32_t warp_sums[kWarps];
  uint32_t candidate_count;
  uint32_t found_bin, found_above, found_count;
};

// Exclusive prefix sum of v in thread order; `total` gets the block's sum. All threads call it.
__device__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* warp_sums, uint32_t& total) {
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
    uint32_t s = lane < kWarps ? warp_sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    if (lane < kWarps) warp_sums[lane] = s;
  }
  __syncthreads();
  const uint32_t before = (warp > 0 ? warp_sums[warp - 1] : 0u) + x - v;
  total = warp_sums[kWarps - 1];
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
__device__ uint32_t narrow(TopkShared& s, int nbins, int shift, Selection& sel) {
  const int per = nbins / kThreads;  // bins per thread, visited from the top bin down
  uint32_t local = 0;
  for (int j = 0; j < per; ++j) local += s.hist[nbins - 1 - (threadIdx.x * per + j)];
  uint32_t total;
  uint32_t run = block_exclusive_scan(local, s.warp_sums, total);
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

__device__ void clear_hist(TopkShared& s) {
  for (int i = threadIdx.x; i < kMaxBins; i += kThreads) s.hist[i] = 0;
  __syncthreads();
}

// One histogram pass over the row in global memory; optionally gathers the candidates' keys.
// Two chunks are loaded before either is counted, to keep more bytes in flight per block.
__device__ void global_pass(TopkShared& s, const float* row, bool aligned, int64_t n, int shift,
                            int nbins, const Selection& sel, bool gather) {
  for (int64_t base = 0; base < n; base += 2 * kChunk) {
    uint32_t key[2][kPerThread];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      load_keys(row, aligned, base + u * kChunk + threadIdx.x * kPerThread, n, key[u]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t t = base + u * kChunk + threadIdx.x * kPerThread;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        if (t + j >= n || (key[u][j] & sel.mask) != sel.prefix) continue;
        atomicAdd(&s.hist[(key[u][j] >> shift) & uint32_t(nbins - 1)], 1u);
        if (gather) s.candidates[atomicAdd(&s.candidate_count, 1u)] = key[u][j];
      }
    }
  }
  __syncthreads();
}

__device__ void shared_pass(TopkShared& s, int shift, int nbins, const Selection& sel) {
  for (uint32_t i = threadIdx.x; i < s.candidate_count; i += kThreads) {
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
__device__ void emit_winners(const TopkParams& p, TopkShared& s, int row, const float* row_ptr,
                             bool aligned, int64_t n, uint32_t thr, uint32_t take_eq) {
  uint32_t base_gt = 0, base_eq = 0;
  for (int64_t chunk = 0; chunk < n; chunk += kChunk) {
    const int64_t t = chunk + int64_t(threadIdx.x) * kPerThread;
    uint32_t key[kPerThread];
    load_keys(row_ptr, aligned, t, n, key);
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const bool in = t + j < n;
      gt += in && key[j] > thr;
      eq += in && key[j] == thr;
    }
    uint32_t total;
    const uint32_t before = block_exclusive_scan(gt | (eq << 16), s.warp_sums, total);
    uint32_t gt_before = base_gt + (before & 0xFFFFu), eq_before = base_eq + (before >> 16);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (t + j >= n) break;
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
    if (base_gt + min(base_eq, take_eq) >= uint32_t(p.k)) break;  // block-uniform
  }
}

__global__ void __launch_bounds__(kThreads, 2) topk_kernel(TopkParams p) {
  const int row = blockIdx.x;
  int64_t n = p.seq_lens[row];
  n = n < 0 ? 0 : (n > p.ld_logits ? p.ld_logits : n);
  if (n <= p.k) {  // every position is taken, in order, then -1
    for (int i = threadIdx.x; i < p.k; i += kThreads) emit(p, row, i, i < n ? i : -1);
    return;
  }
  __shared__ TopkShared s;
  const float* row_ptr = p.logits + int64_t(row) * p.ld_logits;
  const bool aligned = (reinterpret_cast<uintptr_t>(row_ptr) & 15u) == 0;
  if (threadIdx.x == 0) s.candidate_count = 0;
  Selection sel;
  sel.k_rem = uint32_t(p.k);

  clear_hist(s);
  global_pass(s, row_ptr, aligned, n, 21, 2048, sel, false);
  const bool gather = narrow(s, 2048, 21, sel) <= uint32_t(kCandidateCap);
  clear_hist(s);
  global_pass(s, row_ptr, aligned, n, 10, 2048, sel, gather);
  narrow(s, 2048, 10, sel);
  clear_hist(s);
  if (gather) {
    shared_pass(s, 0, 1024, sel);
  } else {
    global_pass(s, row_ptr, aligned, n, 0, 1024, sel, false);
  }
  narrow(s, 1024, 0, sel);
  // sel.prefix is now the k-th largest key and sel.k_rem the ties at it to take.
  emit_winners(p, s, row, row_ptr, aligned, n, sel.prefix, sel.k_rem);
}

}  // namespace

cudaError_t topk(const TopkParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.k <= 0 || (p.out_slots != nullptr && p.page_table == nullptr)) {
    return cudaErrorInvalidValue;
  }
  topk_kernel<<<unsigned(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
