// The gathering top-k kernel, the default for k <= 4096 (topk.cu holds the three-pass kernel,
// DSA_CUDA_TOPK=legacy and k > 4096, and the dispatch). topk_gather_kernel reads the row twice
// instead of three times and holds the rest in shared memory:
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
#include "backend/cuda/pdl.h"
#include "backend/cuda/topk_select.cuh"

namespace dsa::cuda::topk_detail {
namespace {

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
  pdl_enter();
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

}  // namespace

bool topk_gather(const TopkParams& p, cudaStream_t stream, cudaError_t& err) {
  if (p.k > kGMaxK) return false;
  // Fewer CTAs per row where a cluster would not fit (the result is the same).
  const int ranks = gather_ranks(p);
  if (ranks >= 8 && gather_fits<8>(p)) {
    err = launch_gather<8>(p, stream);
  } else if (ranks >= 4 && gather_fits<4>(p)) {
    err = launch_gather<4>(p, stream);
  } else if (ranks >= 2 && gather_fits<2>(p)) {
    err = launch_gather<2>(p, stream);
  } else if (gather_fits<1>(p)) {
    err = launch_gather<1>(p, stream);
  } else {
    return false;
  }
  return true;
}

}  // namespace dsa::cuda::topk_detail
