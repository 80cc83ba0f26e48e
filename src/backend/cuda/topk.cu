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
// The gathering kernel, the default for k <= 4096, is in topk_gather.cu; the shared building
// blocks in topk_select.cuh.
#include <cstdlib>
#include <cstring>

#include "backend/cuda/pdl.h"
#include "backend/cuda/topk_select.cuh"

namespace dsa::cuda {
namespace {

using namespace topk_detail;

// kSliced: launched in clusters of kSlices blocks per row, block r of a row owning positions
// [r * slice, (r + 1) * slice) of it. Otherwise one block per row.
template <bool kSliced>
__global__ void __launch_bounds__(kThreads, 2) topk_kernel(TopkParams p) {
  pdl_enter();
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
  if (!legacy_requested()) {
    cudaError_t err = cudaSuccess;
    if (topk_gather(p, stream, err)) return err;
  }
  return launch_legacy(p, stream);
}

}  // namespace dsa::cuda
