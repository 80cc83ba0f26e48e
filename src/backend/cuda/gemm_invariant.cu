// The batch-invariant tensor-core GEMM (GemmMode::kBatchInvariant, `--gemm invariant`): its entry
// point gemm_invariant, the split-K plan and the per-shape table, and the separate split
// reduction. It runs one of the kernels: mma.sync (gemm_tensor.cu, every layout and fp8 weights)
// or wgmma (gemm_wgmma.cu's cp.async tiles and gemm_wgmma_tma.cu's bulk-copy tiles for bf16 kNK
// weights, gemm_wgmma_fp8.cu's for fp8 kNK weights when asked), as GemmInvariantTuning says (the
// backend fills it from DSA_CUDA_GEMM and DSA_CUDA_GEMM_FP8).
//
//   y_b[m, n] (+)= alpha * sum_k bf16(x_b[m, k]) * w_b(n, k)
//
// x is ROUNDED TO BF16 (round to nearest even, dsa::float_to_bf16) before it is multiplied: the
// backend converts it (or takes the bf16 copy the producing norm wrote, which holds the same
// bits). w is bf16 already (fp8 weights: bf16(e4m3 * scale), dsa::dequant_fp8_weight). Products
// are exact in f32 and are summed in f32 by the tensor cores. This is therefore NOT bit-identical
// to cpu/gemm.cpp (f32 x, sequential sum); it agrees within the bound tests/parity/
// test_parity_gemm derives and checks. GemmMode::kExact (gemm.cu) is the bit-identical one.
//
// Batch invariance: the value of y[m, n] is a fixed function of row m of x, column n of w, K,
// N and the batch count, never of the row count m or of the other rows:
//   1. K is cut into `splits` slices of `slice_k` (a multiple of kGemmSliceGranule) columns.
//      splits comes from K, N and batch only (split_plan: the default table, else a formula; a
//      sweep's GemmInvariantTuning::splits fixes it for every shape alike); never from m or the
//      tile.
//   2. Within a slice, the element is one chain of tensor-core steps over the slice's k16 blocks
//      in ascending order, from +0 (each kernel's header says how: gemm_tensor.cu for mma.sync,
//      gemm_wgmma.cu for wgmma). Which kernel runs follows the tuning, the layout and the weights
//      (dtype, alignment, K), never m; the tile is picked per call and never changes a bit.
//   3. One slice: y = alpha * acc (or y + alpha * acc). Several: every slice writes its chain's
//      result to `partial`, and they are added in slice order 0, 1, ... in f32 (__fadd_rn),
//      then alpha applied the same way: by the last CTA of the output tile to arrive (fused,
//      counted with one atomic counter per tile), by reduce_splits_kernel, or (the bulk-copy
//      kernels, batch 1, 2 to 8 slices: the cluster reduction of gemm_wgmma.cuh) by the tile's
//      CTAs as one cluster, from each other's shared memory; all three run the same additions
//      on the same values, so which one runs (or which CTA is last) never changes a bit.
// Rows of x at or beyond m are never read (zero-filled) and rows of y beyond m never written.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <iterator>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"

namespace dsa::cuda {
namespace {

constexpr int kSplitRefCols = 32;           // the column width split_plan counts CTAs with
constexpr int kSplitTargetCtas = 512;       // about four CTAs per SM of an H200 (132 SMs)
constexpr int kMinSliceK = 512;             // a slice is never shorter (split_plan's own choice)
constexpr int64_t kMaxPartialCols = 73728;  // splits * batch * n whenever splits > 1 (see below)
// The arrival counters of the fused split reduction sit at the start of the scratch buffer, one
// per output tile; a launch with more output tiles reduces with reduce_splits_kernel instead.
constexpr int kSplitCounters = 16384;
// The largest output tile (rows x columns) whose split reduction is fused by default.
constexpr int kFusedReduceMaxTile = 32 * 128;

// y = alpha * (((partial_0 + partial_1) + partial_2) + ...), or y + that; one thread an element.
__global__ void reduce_splits_kernel(TcParams p, int64_t total) {
  pdl_enter();
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t per_slice = int64_t(p.batch) * p.m * p.n;
  const int col = int(e % p.n);
  const int row = int(e / p.n % p.m);
  const int b = int(e / (int64_t(p.n) * p.m));
  float sum = p.partial[e];
  for (int s = 1; s < p.splits; ++s) sum = __fadd_rn(sum, p.partial[s * per_slice + e]);
  finish_element(p, p.y + int64_t(b) * p.bs_y + int64_t(row) * p.ld_y + col, sum);
}

// The default table. Per shape (n, k, batch): the split count (0: split_plan's formula) and the
// tile for each class of m: m <= 16, m <= 64, m > 64 (-1: the class default below). Chosen from
// a sweep of dsa_gpu_bench --gemm-sweep (scripts/gpu-gemm-sweep.sh) on an H200. The split count
// is per shape, never per class: that is the invariance (the header comment, 1.).
struct ShapeChoice {
  int n, k, batch, splits;
  int tile[3];             // mma.sync tiles (gemm_tensor.cu's kTiles, by index)
  const char* wg_tile[3];  // wgmma tiles by name (gemm_wgmma.cu), nullptr: wgmma_pick_tile
};
constexpr int kClassTile[3] = {
    2, 6, 6};  // 16 x 64 k128, 64 x 128 k64 (the sweep: it beat 128 x 128 at B = 256)
constexpr ShapeChoice kShapeTable[] = {
    // The V3.2 projections (bench/gpu/bench_gemm.h names them). Split counts: the wgmma
    // kernel's sweeps of 2026-12-04 on the H200 (bench/results/2026-12-04-h200-gemm-tma.md: the
    // count with the least worst ratio to cuBLASLt over B = 1, 8, 64, 256, every shape but
    // kv_b absorb, whose kKN layout runs on mma.sync and keeps the 2026-12-03 sweep's count).
    // mma tiles: the 2026-12-03 sweep's. wgmma tiles: the 2026-12-04 sweeps' (nullptr would
    // leave the pick to wgmma_pick_tile).
    // q_a
    {1536, 7168, 1, 4, {4, 6, 6}, {"tma.8x64.s8", "tma.16x128.s6", "tma.64x128.s4"}},
    // q_b
    {128 * 192, 1536, 1, 1, {1, 6, 6}, {"tma.8x64.s8", "tma.64x128.s4", "tma.64x128.s4"}},
    // kv_a
    {576, 7168, 1, 8, {2, 0, 6}, {"tma.8x64.s8", "tma.16x128.s6", "tma.64x128.s4"}},
    // kv_b absorb (kKN: its wgmma tiles are wgmma_tma_kn_pick_tile's, the mma tiles the fallback's)
    {512, 128, 128, 1, {13, 9, 6}, {nullptr, nullptr, nullptr}},
    // kv_b up
    {128, 512, 128, 1, {4, 6, 12}, {"tma.8x128.s6", "tma.32x128.s5", "tma.64x128.s4"}},
    // o
    {7168, 128 * 128, 1, 2, {13, 6, 6}, {"tma.8x128.s6", "tma.32x128.s5", "tma.256x128.s4"}},
    // indexer wq_b
    {64 * 128, 1536, 1, 1, {2, 5, 6}, {"tma.8x64.s8", "tma.64x64.s6", "tma.64x128.s4"}},
    // indexer wk
    {128, 7168, 1, 8, {2, 2, 5}, {"tma.8x64.s8", "tma.8x64.s8", "tma.16x128.s6"}},
    // indexer weights_proj
    {64, 7168, 1, 8, {2, 2, 5}, {"tma.8x64.s8", "tma.8x64.s8", "tma.8x64.s8"}},
    // mlp gate / up
    {18432, 7168, 1, 1, {1, 6, 6}, {"tma.8x128.s6", "tma.64x128.s4", "tma.128x128.s5"}},
    // mlp down
    {7168, 18432, 1, 2, {13, 6, 6}, {"tma.8x128.s6", "tma.32x128.s5", "tma.256x128.s4"}},
    // lm_head
    {32768, 7168, 1, 1, {13, 6, 11}, {"tma.8x128.s6", "tma.64x128.s4", "tma.256x128.s4"}},
    // The model's fused projections (src/model/model.cpp): x_proj (q_a ‖ wk ‖ kv_a), q_up
    // (q_b ‖ wq_b), gate_up (gate ‖ up). The wgmma sweep of 2026-12-04 (ONLY="x_proj q_up
    // gate_up", bench/results/2026-12-04-h200-indexer-e4m3.md): its least worst count for x_proj
    // was 2 splits (1.83x at B = 256), but 7 costs B = 256 only 0.8 us more and saves B = 1 4 us.
    {1536 + 128 + 576, 7168, 1, 7, {4, 6, 6}, {"tma.8x128.s6", "tma.64x128.s4", "tma.64x128.s4"}},
    // x_proj with weights_proj (bf16 weights; not swept: x_proj's choice).
    {1536 + 128 + 576 + 64,
     7168,
     1,
     7,
     {4, 6, 6},
     {"tma.8x128.s6", "tma.64x128.s4", "tma.64x128.s4"}},
    {128 * 192 + 64 * 128,
     1536,
     1,
     1,
     {1, 6, 6},
     {"tma.8x128.s6", "tma.64x128.s4", "tma.256x128.s4"}},
    {2 * 18432, 7168, 1, 1, {1, 6, 6}, {"tma.8x64.s8", "tma.64x64.s6", "tma.128x128.s5"}},
};
// Every table entry that splits keeps splits * batch * n within kMaxPartialCols (the scratch
// bound below relies on it). The tiles are checked by gemm_invariant_prepare.
constexpr bool table_within_partial_bound() {
  for (const ShapeChoice& c : kShapeTable) {
    if (c.splits > 1 && int64_t(c.splits) * c.batch * c.n > kMaxPartialCols) return false;
  }
  return true;
}
static_assert(table_within_partial_bound(), "a table entry breaks the scratch bound");

const ShapeChoice* find_shape(int n, int k, int batch) {
  for (const ShapeChoice& c : kShapeTable) {
    if (c.n == n && c.k == k && c.batch == batch) return &c;
  }
  return nullptr;
}

struct SplitPlan {
  int splits, slice_k;
};

// From K, N and batch only (never m), so every row of every batch size sums in the same order:
// the tuning's count when it gives one (the sweep), else the table's, else the formula. Few
// output tiles (small n, one weight matrix) leave SMs idle at decode sizes, so the formula cuts
// K until about kSplitTargetCtas CTAs of kSplitRefCols columns exist, but never into slices
// shorter than kMinSliceK. When splits > 1: batch * ceil(n / 32) = c < 512 and
// splits <= ceil(512 / c), so splits * batch * n <= (512 / c + 1) * 32 c < 32768 <=
// kMaxPartialCols, which bounds the partial buffer at kMaxPartialCols floats per row of x
// (table_within_partial_bound checks the table's counts against the same bound).
SplitPlan split_plan(int n, int k, int batch, const GemmInvariantTuning& tuning) {
  int splits = 1;
  const ShapeChoice* choice = find_shape(n, k, batch);
  if (tuning.splits > 0) {
    splits = tuning.splits;
  } else if (choice && choice->splits > 0) {
    splits = choice->splits;
  } else {
    const int64_t ctas = int64_t(batch) * ceil_div(n, kSplitRefCols);
    if (ctas < kSplitTargetCtas) {
      splits = int(ceil_div(int64_t(kSplitTargetCtas), ctas));
      splits = std::min(splits, std::max(1, k / kMinSliceK));
    }
  }
  const int slice_k = int(ceil_div(ceil_div(k, splits), kGemmSliceGranule) * kGemmSliceGranule);
  return {int(ceil_div(k, slice_k)), slice_k};
}

// Any function of anything may pick the tile (it never changes a bit); this one uses m's class.
int pick_tile(int m, int n, int k, int batch, const GemmInvariantTuning& tuning) {
  if (tuning.tile >= 0 && tuning.tile < mma_tile_count()) return tuning.tile;
  const int cls = m <= 16 ? 0 : m <= 64 ? 1 : 2;
  const ShapeChoice* choice = find_shape(n, k, batch);
  if (choice && choice->tile[cls] >= 0) return choice->tile[cls];
  return kClassTile[cls];
}

// The table's wgmma tile for m rows of (n, k, batch), as an index (names resolved once), or -1.
int table_wgmma_tile(int m, int n, int k, int batch) {
  constexpr int kShapes = int(std::size(kShapeTable));
  static const std::array<std::array<int, 3>, kShapes> resolved = [] {
    std::array<std::array<int, 3>, kShapes> out{};
    for (int i = 0; i < kShapes; ++i) {
      for (int c = 0; c < 3; ++c) {
        out[i][c] = -1;
        const char* want = kShapeTable[i].wg_tile[c];
        for (int t = 0; want && t < wgmma_tile_count(); ++t) {
          if (std::strcmp(wgmma_tile_info(t).name, want) == 0) out[i][c] = t;
        }
      }
    }
    return out;
  }();
  const ShapeChoice* choice = find_shape(n, k, batch);
  if (!choice) return -1;
  return resolved[choice - kShapeTable][m <= 16 ? 0 : m <= 64 ? 1 : 2];
}

// What 16-byte copies of a bf16 operand need (the copy engine, tma.cu, and cp.async): a 16-byte
// aligned base, row and batch strides in multiples of 16 bytes.
bool describable(const void* base, int64_t ld, int batch, int64_t batch_stride) {
  return aligned16(base) && ld % 8 == 0 && (batch == 1 || batch_stride % 8 == 0);
}

// The reduction of a split plan (GemmInvariantTuning::reduce). The cluster one (2: wherever it
// runs, batch 1 and 2 to kGemmClusterMaxSplits slices; the caller checks the kernel) or, by default
// (-1), where it runs and pays (cluster_pays); else the fused one (1, or by default for tiles of
// at most kFusedReduceMaxTile elements, when the output tiles fit the counters) or the separate
// kernel (0). Every one gives the same bits, so the choice may follow m.
//
// Where the cluster reduction pays, from the GEMM rows of both reductions on an H100 in one call
// (scripts/gpu-reduce.sh, bench/results/2026-12-07-h100-reduce.md): at m <= 16 it wins or ties on
// every split projection (w8a8: x_proj 11.1 against 11.9 us at B = 1, kv_a 6.9 against 7.9, q_a,
// o, down, wk by 2-13%). Above, clusters of the tile's CTAs must be placed whole on a GPC, which
// costs waves: bf16 loses at B = 64 (x_proj 1.46x cuBLASLt against 1.32x, q_a 1.58 against 1.30)
// and w8a8 on x_proj's 7 slices (26.4 against 16.7 us at B = 64); w8a8 still wins on 2 and 4
// slices at m <= 64 (o 56.2 against 60.1, down 63.5 against 67.5, q_a 15.2 against 17.0) and
// loses everywhere at B = 256 (o 187.6 against 176.4).
bool cluster_pays(int m, int splits, bool w8a8) {
  return m <= 16 || (w8a8 && m <= 64 && splits <= 4);
}
bool cluster_reduction(const SplitPlan& plan, int batch, int m, bool w8a8,
                       const GemmInvariantTuning& tuning) {
  const bool runs = batch == 1 && plan.splits >= 2 && plan.splits <= kGemmClusterMaxSplits;
  if (tuning.reduce == 2) return runs;
  return tuning.reduce == -1 && runs && cluster_pays(m, plan.splits, w8a8);
}
bool fused_reduction(const SplitPlan& plan, const GemmTileInfo& shape, int64_t output_tiles,
                     const GemmInvariantTuning& tuning) {
  return plan.splits > 1 && tuning.reduce != 0 &&
         (tuning.reduce == 1 || int64_t(shape.rows) * shape.cols <= kFusedReduceMaxTile) &&
         output_tiles <= kSplitCounters;
}

size_t partial_floats(const GemmParams& p, const SplitPlan& plan) {
  return plan.splits == 1 ? 0 : size_t(plan.splits) * p.batch * p.m * p.n;
}

}  // namespace

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kMma:
      return "mma";
    case GemmKernel::kWgmma:
      return "wgmma";
    default:
      return "default";
  }
}

namespace {
bool is_wgmma(GemmKernel kernel) {
  return (kernel == GemmKernel::kDefault ? kDefaultGemmKernel : kernel) == GemmKernel::kWgmma;
}
// The tuning the mma.sync kernel runs under when the wgmma one was asked for but the layout is
// kKN: the same split count and reduction, the mma kernel's own tile pick.
GemmInvariantTuning mma_tuning(GemmInvariantTuning tuning) {
  if (is_wgmma(tuning.kernel)) tuning.tile = -1;
  tuning.kernel = GemmKernel::kMma;
  return tuning;
}
}  // namespace

int gemm_invariant_tile_count(GemmKernel kernel) {
  return is_wgmma(kernel) ? wgmma_tile_count() : mma_tile_count();
}
const char* gemm_invariant_tile_name(int tile, GemmKernel kernel) {
  if (tile < 0 || tile >= gemm_invariant_tile_count(kernel)) return "default";
  return is_wgmma(kernel) ? wgmma_tile_info(tile).name : mma_tile_info(tile).name;
}
int gemm_invariant_tile_pair(int tile, GemmKernel kernel) {
  if (tile < 0 || tile >= gemm_invariant_tile_count(kernel) || !is_wgmma(kernel)) return 1;
  return wgmma_tile_info(tile).pair;
}
uint64_t gemm_invariant_bulk_copy_fallbacks() { return wgmma_bulk_copy_fallbacks(); }
int gemm_invariant_tile_rows(int tile, GemmKernel kernel) {
  if (tile < 0 || tile >= gemm_invariant_tile_count(kernel)) return 0;
  return is_wgmma(kernel) ? wgmma_tile_info(tile).rows : mma_tile_info(tile).rows;
}
int gemm_invariant_splits(int n, int k, int batch, const GemmInvariantTuning& tuning) {
  return n > 0 && k > 0 && batch > 0 ? split_plan(n, k, batch, tuning).splits : 0;
}
namespace {
// The tile pickers with the split count already planned (gemm_invariant has it).
int tile_for(int m, int n, int k, int batch, int splits, const GemmInvariantTuning& tuning) {
  if (!is_wgmma(tuning.kernel)) return pick_tile(m, n, k, batch, tuning);
  if (tuning.tile >= 0 && tuning.tile < wgmma_tile_count()) return tuning.tile;
  const int tile = table_wgmma_tile(m, n, k, batch);
  return tile >= 0 ? tile : wgmma_pick_tile(m, n, batch, splits);
}
int fp8_tile_for(int m, int n, int splits, const GemmInvariantTuning& tuning) {
  if (tuning.fp8_tile >= 0 && tuning.fp8_tile < wgmma_fp8_tile_count()) return tuning.fp8_tile;
  return wgmma_fp8_pick_tile(m, n, splits);
}
}  // namespace

int gemm_invariant_tile(int m, int n, int k, int batch, const GemmInvariantTuning& tuning) {
  return tile_for(m, n, k, batch, split_plan(n, k, batch, tuning).splits, tuning);
}

bool gemm_invariant_cluster_reduces(int m, int n, int k, const GemmInvariantTuning& tuning) {
  if (m <= 0 || n <= 0 || k <= 0 || !is_wgmma(tuning.kernel)) return false;
  const SplitPlan plan = split_plan(n, k, 1, tuning);
  return wgmma_tile_is_bulk_copy(tile_for(m, n, k, 1, plan.splits, tuning)) &&
         cluster_reduction(plan, 1, m, false, tuning);
}
bool gemm_invariant_w8a8_cluster_reduces(int m, int n, int k, const GemmInvariantTuning& tuning) {
  return m > 0 && n > 0 && k > 0 &&
         cluster_reduction(split_plan(n, k, 1, tuning), 1, m, true, tuning);
}

bool gemm_invariant_fp8_runs_wgmma(const GemmParams& p, const GemmInvariantTuning& tuning) {
  return p.w_fp8 != nullptr && is_wgmma(tuning.kernel) && tuning.fp8 == 1 &&
         p.layout == WeightLayout::kNK && p.batch == 1 && aligned16(p.w_fp8) && p.ld_w % 16 == 0 &&
         p.k % 8 == 0;
}
bool gemm_invariant_kn_runs_wgmma(const GemmParams& p, const GemmInvariantTuning& tuning) {
  return tuning.kn == 1 && is_wgmma(tuning.kernel) && p.layout == WeightLayout::kKN &&
         p.w != nullptr && p.w_fp8 == nullptr && p.k % 8 == 0 &&
         describable(p.w, p.ld_w, p.batch, p.batch_stride_w);
}
int gemm_invariant_kn_tile(int m, const GemmInvariantTuning& tuning) {
  if (tuning.kn_tile >= 0 && tuning.kn_tile < wgmma_tma_tile_count()) return tuning.kn_tile;
  return wgmma_tma_kn_pick_tile(m);
}
int gemm_invariant_kn_tile_count() { return wgmma_tma_tile_count(); }
const char* gemm_invariant_kn_tile_name(int tile) {
  return tile >= 0 && tile < wgmma_tma_tile_count() ? wgmma_tma_tile_info(tile).name : "default";
}
bool gemm_invariant_w8a8_runs(const GemmParams& p) {
  return p.w_fp8 != nullptr && p.x_fp8 && p.layout == WeightLayout::kNK && p.batch == 1 &&
         aligned16(p.w_fp8) && p.ld_w % 16 == 0 && p.k % 16 == 0;
}
bool gemm_w8a8_reads(const Fp8Rows& x8, int m, int k) {
  return x8.codes && x8.scales && aligned16(x8.codes) && x8.ld >= k && x8.ld % 16 == 0 &&
         (reinterpret_cast<uintptr_t>(x8.scales) & 7u) == 0 && x8.ld_scales % 2 == 0 &&
         x8.ld_scales >= m;
}
int gemm_invariant_w8a8_tile_count() { return w8a8_tile_count(); }
const char* gemm_invariant_w8a8_tile_name(int tile) { return w8a8_tile_info(tile).name; }
int gemm_invariant_w8a8_tile(int m, const GemmInvariantTuning& tuning) {
  if (tuning.w8a8_tile >= 0 && tuning.w8a8_tile < w8a8_tile_count()) return tuning.w8a8_tile;
  return w8a8_pick_tile(m);
}
int gemm_invariant_fp8_tile_count() { return wgmma_fp8_tile_count(); }
const char* gemm_invariant_fp8_tile_name(int tile) { return wgmma_fp8_tile_info(tile).name; }
int gemm_invariant_fp8_tile(int m, int n, int k, const GemmInvariantTuning& tuning) {
  return fp8_tile_for(m, n, split_plan(n, k, 1, tuning).splits, tuning);
}

cudaError_t gemm_invariant_prepare() {
  // Every tile the table names exists (a misspelt wgmma name would quietly fall back to
  // wgmma_pick_tile): the backend refuses to start otherwise.
  for (const ShapeChoice& c : kShapeTable) {
    for (int cls = 0; cls < 3; ++cls) {
      if (c.tile[cls] < -1 || c.tile[cls] >= mma_tile_count()) return cudaErrorInvalidValue;
      const int m = cls == 0 ? 1 : cls == 1 ? 64 : 256;
      if (c.wg_tile[cls] && table_wgmma_tile(m, c.n, c.k, c.batch) < 0) {
        return cudaErrorInvalidValue;
      }
    }
  }
  if (const cudaError_t err = mma_prepare(); err != cudaSuccess) return err;
  if (const cudaError_t err = wgmma_prepare(); err != cudaSuccess) return err;
  if (const cudaError_t err = w8a8_prepare(); err != cudaSuccess) return err;
  return wgmma_fp8_prepare();
}

size_t gemm_invariant_scratch_floats(const GemmParams& p, const GemmInvariantTuning& tuning) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.batch <= 0) return 0;
  const size_t partial = partial_floats(p, split_plan(p.n, p.k, p.batch, tuning));
  return partial == 0 ? 0 : kSplitCounters + partial;
}

size_t gemm_invariant_scratch_floats_bound(int max_rows) {
  return kSplitCounters + size_t(std::max(max_rows, 0)) * size_t(kMaxPartialCols);
}

cudaError_t gemm_w8a8(const GemmParams& p, const Fp8Rows& x8, float* scratch,
                      const GemmInvariantTuning& tuning, cudaStream_t stream) {
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.ld_y < p.n || p.ld_w < p.k || !p.y ||
      !gemm_invariant_w8a8_runs(p) || !p.w_scale || p.ld_w_scale < ceil_div(p.k, kGemmFp8Block) ||
      !gemm_w8a8_reads(x8, p.m, p.k)) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0) return cudaSuccess;
  const SplitPlan plan = split_plan(p.n, p.k, 1, tuning);
  const int tile = gemm_invariant_w8a8_tile(p.m, tuning);
  const GemmTileInfo shape = w8a8_tile_info(tile);
  const int64_t tiles_n = ceil_div(p.n, shape.cols), tiles_m = ceil_div(p.m, shape.rows);
  if (plan.splits > 65535 || tiles_n > 65535) return cudaErrorInvalidValue;
  if (plan.splits > 1 && !scratch) return cudaErrorInvalidValue;
  TcParams t;
  t.x = nullptr;
  t.w = nullptr;
  t.w8 = p.w_fp8;
  t.w8_scale = p.w_scale;
  t.ld_w8_scale = p.ld_w_scale;
  t.x8 = x8.codes;
  t.ld_x8 = x8.ld;
  t.x8_scale = x8.scales;
  t.ld_x8_scale = x8.ld_scales;
  t.y = p.y;
  t.counters = reinterpret_cast<unsigned*>(scratch);
  t.partial = scratch ? scratch + kSplitCounters : nullptr;
  t.m = p.m, t.n = p.n, t.k = p.k, t.batch = 1;
  t.splits = plan.splits, t.slice_k = plan.slice_k;
  t.ld_x = p.k, t.ld_w = p.ld_w, t.ld_y = p.ld_y;
  t.bs_x = 0, t.bs_w = 0, t.bs_y = p.batch_stride_y;
  t.alpha = p.alpha;
  t.nk = true;
  t.accumulate = p.output == GemmOutput::kAccumulate;
  t.vec_x = true;
  t.vec_w = true;
  t.w_early = p.w_constant;
  t.cluster = cluster_reduction(plan, 1, p.m, true, tuning);
  t.fused = !t.cluster && fused_reduction(plan, shape, tiles_m * tiles_n, tuning);
  // (Its one refusal, operands the copy engine cannot take, holds with either reduction.)
  const cudaError_t err = w8a8_launch(t, tile, stream);
  if (err != cudaSuccess || plan.splits == 1 || t.fused || t.cluster) return err;
  const int64_t total = int64_t(p.m) * p.n;
  constexpr int kThreads = 256;
  launch_kernel(reduce_splits_kernel, ceil_div(total, int64_t(kThreads)), kThreads, 0, stream, t,
                total);
  return cudaGetLastError();
}

cudaError_t gemm_invariant(const GemmParams& p, const Bf16* x_bf16, int64_t ld_xb, int64_t bs_xb,
                           float* scratch, const GemmInvariantTuning& tuning, cudaStream_t stream) {
  const int64_t w_row = p.layout == WeightLayout::kNK ? p.k : p.n;
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.batch < 0 || ld_xb < p.k || p.ld_y < p.n ||
      p.ld_w < w_row) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0 || p.batch == 0) return cudaSuccess;
  const bool fp8 = p.w_fp8 != nullptr;
  if (!x_bf16 || (p.w == nullptr) == !fp8 || !p.y) return cudaErrorInvalidValue;
  if (fp8 && (!p.w_scale || p.layout != WeightLayout::kNK || p.batch != 1 ||
              p.ld_w_scale < ceil_div(p.k, kGemmFp8Block))) {
    return cudaErrorInvalidValue;
  }
  const SplitPlan plan = split_plan(p.n, p.k, p.batch, tuning);
  if (fp8 && plan.slice_k / kGemmFp8Block > kGemmFp8MaxSliceBlocks) return cudaErrorInvalidValue;
  // The kernel follows the tuning, the layout and the weights (dtype, alignment, K), never m
  // (gemm_invariant.cuh): fp8 weights run on the mma.sync kernel unless the tuning asks for the
  // wgmma kernel's fp8 tiles and gemm_invariant_fp8_runs_wgmma holds.
  const bool wgmma_fp8 = fp8 && gemm_invariant_fp8_runs_wgmma(p, tuning);
  const bool wgmma = p.layout == WeightLayout::kNK && !fp8 && is_wgmma(tuning.kernel);
  // kKN weights likewise run on mma.sync unless the tuning asks for the wgmma kernel's bulk-copy
  // tiles and gemm_invariant_kn_runs_wgmma holds.
  // Whether the copy engine and 16-byte cp.async can read x and w (tma.cu, and the cp.async
  // tiles: chunk offsets within a row are multiples of 8 bf16 already).
  const bool vec_x = describable(x_bf16, ld_xb, p.batch, bs_xb);
  const bool vec_w = fp8 ? aligned16(p.w_fp8) && p.ld_w % 16 == 0
                         : describable(p.w, p.ld_w, p.batch, p.batch_stride_w);
  const bool wgmma_kn = gemm_invariant_kn_runs_wgmma(p, tuning) && vec_x;
  int tile = 0;
  GemmTileInfo shape{};
  if (wgmma_fp8) {
    tile = fp8_tile_for(p.m, p.n, plan.splits, tuning);
    shape = wgmma_fp8_tile_info(tile);
  } else if (wgmma_kn) {
    tile = gemm_invariant_kn_tile(p.m, tuning);
    shape = wgmma_tma_tile_info(tile);
  } else if (wgmma) {
    tile = tile_for(p.m, p.n, p.k, p.batch, plan.splits, tuning);
    shape = wgmma_tile_info(tile);
  } else {
    tile = tile_for(p.m, p.n, p.k, p.batch, plan.splits, mma_tuning(tuning));
    shape = mma_tile_info(tile);
  }
  static_assert(kGemmSliceGranule == kGemmFp8Block, "fp8: a slice starts on a scale block");
  // Output tiles: rows of x (and y) by columns of y (output features).
  const int tile_rows = shape.rows, tile_cols = shape.cols;
  const int64_t tiles_n = ceil_div(p.n, tile_cols), tiles_m = ceil_div(p.m, tile_rows);
  if (int64_t(p.batch) * plan.splits > 65535 || tiles_n > 65535) {
    return cudaErrorInvalidValue;  // grid.z and grid.y limits
  }
  if (plan.splits > 1 && !scratch) return cudaErrorInvalidValue;

  TcParams t;
  t.x = reinterpret_cast<const uint16_t*>(x_bf16);
  t.w = reinterpret_cast<const uint16_t*>(p.w);
  t.w8 = p.w_fp8;
  t.w8_scale = p.w_scale;
  t.ld_w8_scale = p.ld_w_scale;
  t.y = p.y;
  t.counters = reinterpret_cast<unsigned*>(scratch);
  t.partial = scratch ? scratch + kSplitCounters : nullptr;
  t.m = p.m, t.n = p.n, t.k = p.k, t.batch = p.batch;
  t.splits = plan.splits, t.slice_k = plan.slice_k;
  t.ld_x = ld_xb, t.ld_w = p.ld_w, t.ld_y = p.ld_y;
  t.bs_x = bs_xb, t.bs_w = p.batch_stride_w, t.bs_y = p.batch_stride_y;
  t.alpha = p.alpha;
  t.nk = p.layout == WeightLayout::kNK;
  t.accumulate = p.output == GemmOutput::kAccumulate;
  t.vec_x = vec_x;
  t.vec_w = vec_w;
  t.w_early = p.w_constant;
  // The cluster reduction where the kernel is a bulk-copy one; else the fused reduction or the
  // separate kernel (fused_reduction). Any of them gives the same bits.
  t.cluster = (wgmma_kn || (wgmma && wgmma_tile_is_bulk_copy(tile))) &&
              cluster_reduction(plan, p.batch, p.m, false, tuning);
  t.fused =
      !t.cluster && fused_reduction(plan, shape, int64_t(p.batch) * tiles_m * tiles_n, tuning);

  auto launch = [&] {
    return wgmma_fp8  ? wgmma_fp8_launch(t, tile, stream)
           : wgmma_kn ? wgmma_tma_launch(t, tile, stream)
           : wgmma    ? wgmma_launch(t, tile, stream)
                      : mma_launch(t, tile, stream);
  };
  cudaError_t err = launch();
  if (err == cudaErrorNotSupported && t.cluster) {
    // The copy engine cannot take the operands (nothing ran): the reduction through partial,
    // on the cp.async tile of the same shape.
    t.cluster = false;
    t.fused = fused_reduction(plan, shape, int64_t(p.batch) * tiles_m * tiles_n, tuning);
    err = launch();
  }
  if (wgmma_kn && err == cudaErrorNotSupported) {
    // The driver would not encode the tensor maps (nothing ran): mma.sync, as without kn.
    GemmInvariantTuning mma = tuning;
    mma.kn = 0;
    return gemm_invariant(p, x_bf16, ld_xb, bs_xb, scratch, mma, stream);
  }
  if (err != cudaSuccess || plan.splits == 1 || t.fused || t.cluster) return err;
  const int64_t total = int64_t(p.batch) * p.m * p.n;
  constexpr int kThreads = 256;
  launch_kernel(reduce_splits_kernel, ceil_div(total, int64_t(kThreads)), kThreads, 0, stream, t,
                total);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
