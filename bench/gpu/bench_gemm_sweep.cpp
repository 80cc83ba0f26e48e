// The GEMM sweep (dsa_gpu_bench --gemm-sweep): every tile configuration and split count of the
// invariant GEMM (GemmInvariantTuning) per V3.2 projection and B, each run checked before it
// counts, and per projection the split count (one for all B) and tiles with the least worst
// ratio to cuBLASLt, printed as kShapeTable lines for src/backend/cuda/gemm_invariant.cu:
//   gemm-sweep/<projection>/B=<rows>/<tile>/s=<splits>[/reduce-kernel]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "bench_gemm.h"
#include "bench_util.h"

namespace dsa::bench {
namespace {

using namespace gemm;

// ---- The sweep (--gemm-sweep): every tile configuration and split count of the invariant GEMM
// on every projection and B, each checked before it counts: nmse against cuBLASLt on the same
// bf16 inputs, and row 0 bit for bit against every other run of the same split count (any tile,
// any B: the invariance argument of gemm_invariant.cu, tested).

// 1, the default count and powers of two, while slices keep 128 columns of k and the CTAs at 64
// columns stay under 2048 (deduplicated by the count split_plan makes of them).
std::vector<int> sweep_splits(const Projection& pr) {
  std::vector<int> asked = {1, cuda::gemm_invariant_splits(pr.n, pr.k, pr.batch, {})};
  const int64_t tiles64 = int64_t(pr.batch) * ((pr.n + 63) / 64);
  for (int s = 2; s <= pr.k / 128 && tiles64 * s <= 2048; s *= 2) asked.push_back(s);
  std::vector<int> out;
  for (int s : asked) {
    cuda::GemmInvariantTuning t;
    t.splits = s;
    const int made = cuda::gemm_invariant_splits(pr.n, pr.k, pr.batch, t);
    if (std::find(out.begin(), out.end(), made) == out.end()) out.push_back(made);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The tiles worth timing at B rows: 16-row tiles for decode, 16- and 64-row tiles and the
// 128 x 128 ones at 64, the 64-row tiles and up past it.
// wgmma: the bulk-copy tiles ("tma.", the same bits as its cp.async tiles, faster everywhere
// measured) up to max(16, B) rows.
std::vector<int> sweep_tiles(int rows, cuda::GemmKernel kernel) {
  std::vector<int> out;
  for (int t = 0; t < cuda::gemm_invariant_tile_count(kernel); ++t) {
    const int bm = cuda::gemm_invariant_tile_rows(t, kernel);
    const std::string name = cuda::gemm_invariant_tile_name(t, kernel);
    if (kernel == cuda::GemmKernel::kWgmma) {
      if (name.rfind("tma.", 0) == 0 && bm <= std::max(16, rows)) out.push_back(t);
      continue;
    }
    const bool keep = rows <= 16   ? bm == 16
                      : rows <= 64 ? bm <= 64 || name.rfind("128x128", 0) == 0
                                   : bm >= 64;
    if (keep) out.push_back(t);
  }
  return out;
}

struct SweepRun {
  int tile, splits, reduce;
  double us;
  bool ok;
};

struct SweepCell {  // one projection at one B
  double cublas_us = 0, default_us = 0;
  int default_tile = -1, default_splits = 0;
  std::vector<SweepRun> runs;
  const SweepRun* best(int splits) const {  // the fastest checked run of a split count
    const SweepRun* b = nullptr;
    for (const SweepRun& r : runs) {
      if (r.ok && (splits == 0 || r.splits == splits) && (!b || r.us < b->us)) b = &r;
    }
    return b;
  }
  double us_of(int tile, int splits) const {
    for (const SweepRun& r : runs) {
      if (r.ok && r.tile == tile && r.splits == splits && r.reduce != 0) return r.us;
    }
    return 0;
  }
};

void sweep_projection(BenchContext& ctx, const Projection& pr, std::mt19937_64& gen,
                      double deadline_s, cuda::GemmKernel kernel, bool default_splits_only,
                      std::vector<SweepCell>& cells) {
  Backend& be = ctx.backend;
  const ProjectionBuffers buf(be, pr, gen);
  const int calls = std::max(buf.sets, 4);
  const std::vector<int> splits = sweep_splits(pr);
  std::vector<std::vector<float>> row0(splits.size());  // per split count, the first run's row 0
  for (int rows : kRows) {
    SweepCell cell;
    GemmParams p = projection_params(pr, rows, buf);
    auto run_once = [&] { return run_on_zero(be, p, buf); };
    be.set_gemm_mode(GemmMode::kFast);
    const std::vector<float> ref = run_once();
    cell.cublas_us = time_projection(ctx, p, buf, calls);
    be.set_gemm_mode(GemmMode::kBatchInvariant);
    cuda::GemmInvariantTuning tuning;
    tuning.kernel = kernel;
    set_gemm_invariant_tuning(be, tuning);
    cell.default_us = time_projection(ctx, p, buf, calls);
    cell.default_tile = cuda::gemm_invariant_tile(rows, pr.n, pr.k, pr.batch, tuning);
    cell.default_splits = cuda::gemm_invariant_splits(pr.n, pr.k, pr.batch, tuning);

    auto run_checked = [&](int tile, size_t si, int reduce) {
      tuning.tile = tile, tuning.splits = splits[si], tuning.reduce = reduce;
      set_gemm_invariant_tuning(be, tuning);
      const std::vector<float> y = run_once();
      const double err = nmse(y, ref);
      bool same = true;
      if (row0[si].empty()) {
        if (err <= kSweepNmse) row0[si].assign(y.begin(), y.begin() + pr.n);  // the reference
      } else {
        same = std::memcmp(row0[si].data(), y.data(), size_t(pr.n) * sizeof(float)) == 0;
      }
      SweepRun r{tile, splits[si], reduce, time_projection(ctx, p, buf, calls),
                 err <= kSweepNmse && same};
      if (!r.ok) {
        std::printf("  SWEEP CHECK FAILED %s B=%d tile %s splits %d reduce %d: nmse %.3g%s\n",
                    pr.name, rows, cuda::gemm_invariant_tile_name(tile, kernel), splits[si], reduce,
                    err, same ? "" : ", row 0 differs from the same split count elsewhere");
      }
      BenchResult res;
      res.name = std::string("gemm-sweep/") + pr.name + "/B=" + std::to_string(rows) + "/" +
                 cuda::gemm_invariant_tile_name(tile, kernel) + "/s=" + std::to_string(splits[si]) +
                 (reduce == 0 ? "/reduce-kernel" : "");
      res.us = r.us;
      res.extra = {{"tile", tile}, {"splits", splits[si]},         {"reduce", reduce},
                   {"rows", rows}, {"nmse_vs_cublaslt", err},      {"row0_same", same},
                   {"ok", r.ok},   {"cublaslt_us", cell.cublas_us}};
      ctx.add(std::move(res));
      cell.runs.push_back(r);
    };
    // A configuration that throws (a launch it cannot make) is reported and skipped; the sweep
    // goes on.
    auto try_run = [&](int tile, size_t si, int reduce) {
      try {
        run_checked(tile, si, reduce);
      } catch (const std::exception& e) {
        std::printf("  SWEEP CHECK FAILED %s B=%d tile %s splits %d reduce %d: %s\n", pr.name, rows,
                    cuda::gemm_invariant_tile_name(tile, kernel), splits[si], reduce, e.what());
      }
    };
    // The default split count first, then the others from 1 up.
    std::vector<size_t> order(splits.size());
    for (size_t si = 0; si < splits.size(); ++si) order[si] = si;
    std::stable_partition(order.begin(), order.end(),
                          [&](size_t si) { return splits[si] == cell.default_splits; });
    for (size_t si : order) {
      if (default_splits_only && splits[si] != cell.default_splits) continue;
      for (int tile : sweep_tiles(rows, kernel)) {
        if (ctx.elapsed_s() > deadline_s) break;
        try_run(tile, si, -1);
      }
    }
    // The separate reduce kernel against the fused reduction, on the best split run.
    const SweepRun* best = cell.best(0);
    if (best && best->splits > 1 && ctx.elapsed_s() <= deadline_s) {
      const size_t si =
          size_t(std::find(splits.begin(), splits.end(), best->splits) - splits.begin());
      try_run(best->tile, si, 0);
    }
    set_gemm_invariant_tuning(be, {});
    best = cell.best(0);
    std::printf("  sweep %-12s B=%-3d cublaslt %8.2f us | default %8.2f us %5.2fx (%s, %d splits)",
                pr.name, rows, cell.cublas_us, cell.default_us, cell.default_us / cell.cublas_us,
                cuda::gemm_invariant_tile_name(cell.default_tile, kernel), cell.default_splits);
    if (best) {
      std::printf(" | best %8.2f us %5.2fx (%s, %d splits%s)", best->us, best->us / cell.cublas_us,
                  cuda::gemm_invariant_tile_name(best->tile, kernel), best->splits,
                  best->reduce == 0 ? ", reduce kernel" : "");
    }
    std::puts("");
    std::fflush(stdout);
    cells.push_back(std::move(cell));
  }
}

}  // namespace

void run_gemm_sweep(BenchContext& ctx, const GemmSweepOptions& options) {
  std::mt19937_64 gen(77);
  const cuda::GemmKernel kernel =
      options.kernel == "wgmma" ? cuda::GemmKernel::kWgmma : cuda::GemmKernel::kMma;
  std::printf("gemm sweep: the %s kernel, %d tile configurations, budget %.0f s\n",
              cuda::gemm_kernel_name(kernel), cuda::gemm_invariant_tile_count(kernel),
              options.budget_s);
  std::vector<const Projection*> swept;
  for (const Projection& pr : kV32) {
    if (options.only.empty() ||
        std::find(options.only.begin(), options.only.end(), pr.name) != options.only.end()) {
      swept.push_back(&pr);
    }
  }
  // Projection i may sweep until its share of the budget has passed (time one leaves unused
  // goes to the next), so an over-long sweep still covers every projection.
  const double start_s = ctx.elapsed_s();
  std::vector<SweepCell> cells;  // [projection][B]
  for (size_t i = 0; i < swept.size(); ++i) {
    const double deadline_s = start_s + options.budget_s * double(i + 1) / double(swept.size());
    sweep_projection(ctx, *swept[i], gen, deadline_s, kernel, options.default_splits_only, cells);
  }
  constexpr int kB = int(std::size(kRows));
  // Per projection: the split count (one for every B: the invariance) whose worst ratio over B
  // is least, with the tile for each class of m (m <= 16: B = 1 and 8 share one; <= 64; > 64).
  std::puts("\ngemm sweep: per projection, one split count for every B and a tile per class of m");
  std::printf("%-14s %6s", "projection", "splits");
  for (int rows : kRows) std::printf(" %24s", ("B=" + std::to_string(rows)).c_str());
  std::puts("   worst");
  std::vector<std::string> table;
  for (size_t i = 0; i < swept.size(); ++i) {
    const Projection& pr = *swept[i];
    const SweepCell* c = &cells[i * kB];
    int best_splits = 0, best_tile[3] = {-1, -1, -1};
    double best_worst = 1e300, best_ratio[kB] = {};
    for (int s : sweep_splits(pr)) {
      double ratio[kB];
      int tile[3] = {-1, -1, -1};
      double worst = 0;
      // Class 0 (B = 1, 8): the tile with the least worse ratio of the two.
      double class0 = 1e300;
      for (int t : sweep_tiles(kRows[0], kernel)) {
        const double a = c[0].us_of(t, s), b = c[1].us_of(t, s);
        if (a <= 0 || b <= 0) continue;
        const double w = std::max(a / c[0].cublas_us, b / c[1].cublas_us);
        if (w < class0)
          class0 = w, tile[0] = t, ratio[0] = a / c[0].cublas_us, ratio[1] = b / c[1].cublas_us;
      }
      bool complete = tile[0] >= 0;
      for (int bi = 2; bi < kB && complete; ++bi) {
        const SweepRun* r = c[bi].best(s);
        complete = r != nullptr;
        if (r) tile[bi - 1] = r->tile, ratio[bi] = c[bi].us_of(r->tile, s) / c[bi].cublas_us;
        if (r && ratio[bi] <= 0) ratio[bi] = r->us / c[bi].cublas_us;
      }
      if (!complete) continue;
      for (int bi = 0; bi < kB; ++bi) worst = std::max(worst, ratio[bi]);
      if (worst < best_worst) {
        best_worst = worst, best_splits = s;
        std::copy(tile, tile + 3, best_tile);
        std::copy(ratio, ratio + kB, best_ratio);
      }
    }
    if (best_splits == 0) {
      std::printf("%-14s   (incomplete: over budget or every run failed its check)\n", pr.name);
      continue;
    }
    std::printf("%-14s %6d", pr.name, best_splits);
    for (int bi = 0; bi < kB; ++bi) {
      const int t = best_tile[bi < 2 ? 0 : bi - 1];
      std::printf(" %5.2f %18s", best_ratio[bi], cuda::gemm_invariant_tile_name(t, kernel));
    }
    std::printf("   %5.2f\n", best_worst);
    // The entry holds a tile per class of m for each kernel: the swept kernel's from the sweep,
    // the other's as its pick today (at m = 1, 64 and 256, under the new split count).
    const cuda::GemmKernel other =
        kernel == cuda::GemmKernel::kWgmma ? cuda::GemmKernel::kMma : cuda::GemmKernel::kWgmma;
    int kept[3];
    for (int c = 0; c < 3; ++c) {
      cuda::GemmInvariantTuning t;
      t.kernel = other, t.splits = best_splits;
      kept[c] = cuda::gemm_invariant_tile(c == 0 ? 1 : c == 1 ? 64 : 256, pr.n, pr.k, pr.batch, t);
    }
    const bool wgmma = kernel == cuda::GemmKernel::kWgmma;
    auto list = [](const int* t, bool names) {  // mma tiles by index, wgmma tiles by name
      std::string out = "{";
      for (int c = 0; c < 3; ++c) {
        out += c ? ", " : "";
        if (names) {
          out += '"';
          out += cuda::gemm_invariant_tile_name(t[c], cuda::GemmKernel::kWgmma);
          out += '"';
        } else {
          out += std::to_string(t[c]);
        }
      }
      return out + "}";
    };
    table.push_back("    {" + std::to_string(pr.n) + ", " + std::to_string(pr.k) + ", " +
                    std::to_string(pr.batch) + ", " + std::to_string(best_splits) + ", " +
                    list(wgmma ? kept : best_tile, false) + ", " +
                    list(wgmma ? best_tile : kept, true) + "},  // " + pr.name);
  }
  std::printf(
      "\ngemm sweep: kShapeTable entries for src/backend/cuda/gemm_invariant.cu (%s tiles swept)\n",
      cuda::gemm_kernel_name(kernel));
  for (const std::string& line : table) std::puts(line.c_str());
}

}  // namespace dsa::bench
