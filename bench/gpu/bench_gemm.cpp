// GEMM benches: every projection of a V3.2 layer at B (rows) = 1, 8, 64, 256, the batch-invariant
// tensor-core GEMM (`--gemm invariant`), each of its kernels forced (mma.sync, wgmma), against
// cuBLASLt (`--gemm fast`) in the same run:
//   gemm/{invariant-mma,invariant-wgmma,cublaslt}/<projection>/B=<rows>
// Bytes: the bf16 weights once, x read (bf16 when the model hands the GEMM the norm's bf16 copy,
// else f32), y written (and read when accumulating). Floor: max(bytes at the copy bandwidth,
// flops at the cuBLASLt bf16 rate). Both modes are timed the same way: graph-launched back to
// back, weights rotating over > 3x L2 when one set would fit in it. extra.vs_cublaslt is the
// invariant time over the cuBLASLt time of the same shape (the target is <= 1.3); every invariant
// run is also checked against cuBLASLt's output (nmse <= 1e-7: the same bf16 inputs, another
// order), and a failure is printed as "GEMM CHECK FAILED" and marked "!" in the ratio tables.
//
// fp8 weights (`--weights fp8`: e4m3 with 128x128 block scales, GemmParams::w_fp8): the
// projections the model keeps in fp8 also run the invariant GEMM on fp8 weights, on the mma.sync
// kernel (gemm/invariant-fp8w/<projection>/B=<rows>) and on the wgmma kernel's fp8 tiles
// (gemm/invariant-fp8w-wgmma/...), whatever --gemm-kernels says. Bytes: the
// fp8 weights and their scales once, x and y as above; the floor as above. Weight set 0 of the
// bf16 rows then holds the dequantized fp8 set 0, so each fp8 run is checked bit for bit against
// the bf16 run of the same kernel on the same values ("FP8W BITS DIFFER" when not);
// extra.vs_invariant_bf16 is the fp8 time over that bf16 time (the hope at B <= 64: near 0.5).
// At B = 1 every fp8 tile of the wgmma kernel is also timed by name
// (gemm/invariant-fp8w-tile/<tile>/...), the same check on each. With fp8 activations too
// (`--weights w8a8`, the e4m3 kernel): gemm/invariant-fp8w-w8a8/..., the quantizer included,
// checked by nmse against the fp8-weight GEMM on the same x (x's e4m3 rounding).
//
// kKN projections (kv_b absorb) run on the wgmma kernel's bulk-copy tiles read MN-major
// (GemmInvariantTuning::kn = 1, the default) in the wgmma rows; they are also timed on the
// mma.sync fallback under the wgmma kernel (kn = 0, DSA_CUDA_GEMM_KN=mma):
// gemm/invariant-wgmma-kn-mma/<projection>/B=<rows>, the same check against cuBLASLt, a "*" line
// under the ratio tables.
//
// --gemm-sweep runs bench_gemm_sweep.cpp instead.
#include "bench_gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "bench_util.h"

namespace dsa::bench {
namespace {

using namespace gemm;

constexpr double kW8a8BenchNmse = 1e-2;  // x's e4m3 rounding is about 1e-3

// A result row over the fp8 weights' bytes (the codes, their scales, x and y).
BenchResult fp8_result(const BenchContext& ctx, std::string name, double us, double bytes8,
                       double flops) {
  BenchResult r;
  r.name = std::move(name);
  r.us = us;
  r.bytes = bytes8;
  r.flops = flops;
  r.floor_us = std::max(ctx.hbm_floor_us(bytes8), ctx.bf16_floor_us(flops));
  r.floor_kind = ctx.hbm_floor_us(bytes8) >= ctx.bf16_floor_us(flops) ? "hbm" : "bf16";
  return r;
}

// Every fp8 tile of the wgmma kernel named in turn (GemmInvariantTuning::fp8_tile), B = 1:
// gemm/invariant-fp8w-tile/<tile>/<projection>/B=1, each checked bit for bit against the bf16
// wgmma run on the dequantized values (`want`); extra.vs_invariant_bf16 as above.
void bench_fp8_tiles(BenchContext& ctx, const Projection& pr, const GemmParams& p8,
                     const ProjectionBuffers& buf, const std::vector<float>& want, double bf16_us,
                     double bytes8, double flops) {
  Backend& be = ctx.backend;
  for (int tile = 0; tile < cuda::gemm_invariant_fp8_tile_count(); ++tile) {
    cuda::GemmInvariantTuning tuning;
    tuning.kernel = cuda::GemmKernel::kWgmma;
    tuning.fp8 = 1;
    tuning.fp8_tile = tile;
    set_gemm_invariant_tuning(be, tuning);
    const std::vector<float> got = run_on_zero(be, p8, buf);
    const bool same = got.size() == want.size() &&
                      std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
    const char* name = cuda::gemm_invariant_fp8_tile_name(tile);
    if (!same) std::printf("  FP8W BITS DIFFER %s B=1 tile %s from the bf16 run\n", pr.name, name);
    const double us = time_projection(ctx, p8, buf, std::max(2 * buf.sets8, 20));
    BenchResult r =
        fp8_result(ctx, std::string("gemm/invariant-fp8w-tile/") + name + "/" + pr.name + "/B=1",
                   us, bytes8, flops);
    r.extra = {{"n", pr.n},
               {"k", pr.k},
               {"rows", 1},
               {"tile", name},
               {"ok", same},
               {"invariant_bf16_us", bf16_us},
               {"vs_invariant_bf16", us / bf16_us}};
    ctx.add(std::move(r));
  }
  set_gemm_invariant_tuning(be, {});
}

void bench_projection(BenchContext& ctx, const Projection& pr, std::mt19937_64& gen) {
  Backend& be = ctx.backend;
  const ProjectionBuffers buf(be, pr, gen, true);
  const double w_bytes = 2.0 * double(buf.w_elems);
  const int sets = buf.sets;
  for (int rows : kRows) {
    const GemmParams p = projection_params(pr, rows, buf);
    const double x_bytes = double(pr.batch) * rows * pr.k * (pr.bf16_copy ? 2 : 4);
    const double y_bytes =
        4.0 * pr.batch * rows * pr.n * (pr.output == GemmOutput::kAccumulate ? 2 : 1);
    const double bytes = w_bytes + x_bytes + y_bytes;
    const double flops = 2.0 * pr.batch * rows * double(pr.n) * pr.k;
    const double floor_us = std::max(ctx.hbm_floor_us(bytes), ctx.bf16_floor_us(flops));
    auto run_once = [&] { return run_on_zero(be, p, buf); };
    be.set_gemm_mode(GemmMode::kFast);
    const std::vector<float> ref = run_once();
    const double cublas_us = time_projection(ctx, p, buf, std::max(2 * sets, 20));
    // One invariant run under `tuning`: its time and its nmse against cuBLASLt (the same bf16
    // inputs; only the order differs), a failed check printed.
    be.set_gemm_mode(GemmMode::kBatchInvariant);
    auto measure = [&](const cuda::GemmInvariantTuning& tuning, const char* what, double& t,
                       double& e) {
      set_gemm_invariant_tuning(be, tuning);
      e = nmse(run_once(), ref);
      t = time_projection(ctx, p, buf, std::max(2 * sets, 20));
      set_gemm_invariant_tuning(be, {});
      if (!(e <= kSweepNmse)) {
        std::printf("  GEMM CHECK FAILED %s B=%d %s: nmse %.3g against cuBLASLt\n", pr.name, rows,
                    what, e);
      }
    };
    const std::vector<cuda::GemmKernel> kernels = benched_kernels(ctx);
    // A kernel's default tuning: kKN on the wgmma tiles whatever DSA_CUDA_GEMM_KN says (mma.sync:
    // no effect).
    auto tuning_of = [](cuda::GemmKernel kernel) {
      cuda::GemmInvariantTuning tuning;
      tuning.kernel = kernel;
      tuning.kn = 1;
      return tuning;
    };
    std::vector<double> us(kernels.size()), err(kernels.size());
    for (size_t i = 0; i < kernels.size(); ++i) {
      measure(tuning_of(kernels[i]), cuda::gemm_kernel_name(kernels[i]), us[i], err[i]);
    }
    auto add = [&](const std::string& mode, double t, nlohmann::json extra) {
      BenchResult r;
      r.name = "gemm/" + mode + "/" + pr.name + "/B=" + std::to_string(rows);
      r.us = t;
      r.bytes = bytes;
      r.flops = flops;
      r.floor_us = floor_us;
      r.floor_kind = ctx.hbm_floor_us(bytes) >= ctx.bf16_floor_us(flops) ? "hbm" : "bf16";
      r.extra = {{"n", pr.n},
                 {"k", pr.k},
                 {"batch", pr.batch},
                 {"rows", rows},
                 {"sets", sets},
                 {"bf16_copy", pr.bf16_copy},
                 {"splits", cuda::gemm_invariant_splits(pr.n, pr.k, pr.batch, {})}};
      if (extra.is_object()) r.extra.update(extra);  // {} arrives as null
      ctx.add(std::move(r));
    };
    for (size_t i = 0; i < kernels.size(); ++i) {
      const cuda::GemmInvariantTuning tuning = tuning_of(kernels[i]);
      std::string tile;
      if (pr.layout == WeightLayout::kNK || kernels[i] == cuda::GemmKernel::kMma) {
        tile = cuda::gemm_invariant_tile_name(
            cuda::gemm_invariant_tile(rows, pr.n, pr.k, pr.batch, tuning), kernels[i]);
      } else if (cuda::gemm_invariant_kn_runs_wgmma(p, tuning)) {
        tile = cuda::gemm_invariant_kn_tile_name(cuda::gemm_invariant_kn_tile(rows, tuning));
      } else {
        tile = "mma fallback (kKN)";
      }
      add(std::string("invariant-") + cuda::gemm_kernel_name(kernels[i]), us[i],
          {{"vs_cublaslt", us[i] / cublas_us},
           {"nmse_vs_cublaslt", err[i]},
           {"ok", err[i] <= kSweepNmse},
           {"tile", tile}});
    }
    add("cublaslt", cublas_us, nlohmann::json::object());
    if (pr.layout == WeightLayout::kKN) {
      // kKN weights on mma.sync under the wgmma kernel (GemmInvariantTuning::kn = 0).
      cuda::GemmInvariantTuning tuning;
      tuning.kernel = cuda::GemmKernel::kWgmma;
      tuning.kn = 0;
      double t = 0, e = 0;
      measure(tuning, "wgmma, kKN on mma.sync", t, e);
      add("invariant-wgmma-kn-mma", t,
          {{"vs_cublaslt", t / cublas_us},
           {"nmse_vs_cublaslt", e},
           {"ok", e <= kSweepNmse},
           {"tile", "mma fallback (kKN)"}});
    }
    if (!pr.fp8) continue;
    // fp8 weights on set 0, each fp8 kernel against the bf16 run of its kernel on the dequantized
    // values: mma.sync ("invariant-fp8w") and the wgmma fp8 tiles ("invariant-fp8w-wgmma").
    const GemmParams p8 = with_fp8(p, buf);
    const double bytes8 = double(buf.w_elems) + 4.0 * double(buf.scale_elems) + x_bytes + y_bytes;
    for (const bool wgmma : {false, true}) {
      cuda::GemmInvariantTuning tuning;
      tuning.kernel = wgmma ? cuda::GemmKernel::kWgmma : cuda::GemmKernel::kMma;
      tuning.fp8 = wgmma ? 1 : 0;
      if (wgmma && !cuda::gemm_invariant_fp8_runs_wgmma(p8, tuning)) continue;
      set_gemm_invariant_tuning(be, tuning);
      const std::vector<float> want = run_on_zero(be, p, buf);
      const double bf16_us = time_projection(ctx, p, buf, std::max(2 * sets, 20));
      const std::vector<float> got = run_on_zero(be, p8, buf);
      const bool same = std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
      const char* kernel = wgmma ? "wgmma" : "mma";
      if (!same) {
        std::printf("  FP8W BITS DIFFER %s B=%d from the bf16 %s run\n", pr.name, rows, kernel);
      }
      const double fp8_us = time_projection(ctx, p8, buf, std::max(2 * buf.sets8, 20));
      set_gemm_invariant_tuning(be, {});
      BenchResult r = fp8_result(ctx,
                                 std::string("gemm/invariant-fp8w") + (wgmma ? "-wgmma/" : "/") +
                                     pr.name + "/B=" + std::to_string(rows),
                                 fp8_us, bytes8, flops);
      r.extra = {{"n", pr.n},
                 {"k", pr.k},
                 {"rows", rows},
                 {"sets", buf.sets8},
                 {"bf16_copy", pr.bf16_copy},
                 {"splits", cuda::gemm_invariant_splits(pr.n, pr.k, pr.batch, {})},
                 {"tile", wgmma ? cuda::gemm_invariant_fp8_tile_name(
                                      cuda::gemm_invariant_fp8_tile(rows, pr.n, pr.k, tuning))
                                : cuda::gemm_invariant_tile_name(cuda::gemm_invariant_tile(
                                      rows, pr.n, pr.k, pr.batch, tuning))},
                 {"vs_cublaslt", fp8_us / cublas_us},
                 {"invariant_bf16_us", bf16_us},
                 {"vs_invariant_bf16", fp8_us / bf16_us},
                 {"ok", same}};
      ctx.add(std::move(r));
      if (wgmma && rows == 1) bench_fp8_tiles(ctx, pr, p8, buf, want, bf16_us, bytes8, flops);
    }
    // fp8 activations too (GemmParams::x_fp8, `--weights w8a8`): x quantized and the e4m3 kernel,
    // both timed as the model calls them (the quantizer's launch included). Checked by nmse
    // against the fp8-weight GEMM on the same f32 x (no bf16 copy: the w8a8 GEMM reads x itself,
    // and the bench's bf16 copy holds other values): x's e4m3 rounding alone, about 1e-3.
    GemmParams pa = p8;
    pa.x_fp8 = true;
    pa.x_bf16 = nullptr;
    if (!cuda::gemm_invariant_w8a8_runs(pa)) continue;
    GemmParams pd = p8;
    pd.x_bf16 = nullptr;
    const std::vector<float> dequant = run_on_zero(be, pd, buf);
    const double e8 = nmse(run_on_zero(be, pa, buf), dequant);
    const bool ok8 = e8 <= kW8a8BenchNmse;
    if (!ok8) {
      std::printf(
          "  W8A8 CHECK FAILED %s B=%d: nmse %.3g against the fp8-weight GEMM on the same x\n",
          pr.name, rows, e8);
    }
    const double w8a8_us = time_projection(ctx, pa, buf, std::max(2 * buf.sets8, 20));
    const auto wg = std::find(kernels.begin(), kernels.end(), cuda::GemmKernel::kWgmma);
    const double bf16_us = wg == kernels.end() ? us.front() : us[size_t(wg - kernels.begin())];
    BenchResult r = fp8_result(
        ctx, std::string("gemm/invariant-fp8w-w8a8/") + pr.name + "/B=" + std::to_string(rows),
        w8a8_us, bytes8, flops);
    r.extra = {
        {"n", pr.n},
        {"k", pr.k},
        {"rows", rows},
        {"sets", buf.sets8},
        {"splits", cuda::gemm_invariant_splits(pr.n, pr.k, pr.batch, {})},
        {"tile", cuda::gemm_invariant_w8a8_tile_name(cuda::gemm_invariant_w8a8_tile(rows, {}))},
        {"vs_cublaslt", w8a8_us / cublas_us},
        {"invariant_bf16_us", bf16_us},
        {"vs_invariant_bf16", w8a8_us / bf16_us},
        {"nmse_vs_dequant", e8},
        {"ok", ok8}};
    ctx.add(std::move(r));
    if (rows != 1) continue;
    // Every w8a8 tile at B = 1 (gemm/invariant-fp8w-w8a8-tile/<tile>/...): each must give the
    // default's bits (a tile never changes one).
    const std::vector<float> want8 = run_on_zero(be, pa, buf);
    for (int tile = 0; tile < cuda::gemm_invariant_w8a8_tile_count(); ++tile) {
      cuda::GemmInvariantTuning tuning;
      tuning.w8a8_tile = tile;
      set_gemm_invariant_tuning(be, tuning);
      const std::vector<float> got = run_on_zero(be, pa, buf);
      const bool same = std::memcmp(got.data(), want8.data(), got.size() * sizeof(float)) == 0;
      const char* name = cuda::gemm_invariant_w8a8_tile_name(tile);
      if (!same) std::printf("  W8A8 BITS DIFFER %s B=1 tile %s from the default\n", pr.name, name);
      const double t = time_projection(ctx, pa, buf, std::max(2 * buf.sets8, 20));
      set_gemm_invariant_tuning(be, {});
      BenchResult rt = fp8_result(
          ctx, std::string("gemm/invariant-fp8w-w8a8-tile/") + name + "/" + pr.name + "/B=1", t,
          bytes8, flops);
      rt.extra = {{"n", pr.n},
                  {"k", pr.k},
                  {"rows", 1},
                  {"tile", name},
                  {"ok", same},
                  {"invariant_bf16_us", bf16_us},
                  {"vs_invariant_bf16", t / bf16_us}};
      ctx.add(std::move(rt));
    }
  }
}

}  // namespace

void run_gemm_benches(BenchContext& ctx) {
  std::mt19937_64 gen(77);
  std::puts("gemm benches: invariant (tensor cores, bf16 x; mma.sync and wgmma) vs cuBLASLt");
  for (const Projection& pr : kV32) bench_projection(ctx, pr, gen);
  // One line of a ratio table: the projection's rows of `mode`, then their tiles.
  auto ratio_line = [&](const std::string& mode, const Projection& pr, const std::string& label) {
    std::printf("%-14s", label.c_str());
    std::string tiles;
    for (int rows : kRows) {
      const std::string want = "gemm/" + mode + "/" + pr.name + "/B=" + std::to_string(rows);
      for (const BenchResult& r : ctx.results()) {
        if (r.name != want) continue;
        std::printf(" %8.2f%s", r.extra["vs_cublaslt"].get<double>(),
                    r.extra["ok"].get<bool>() ? " " : "!");
        tiles += (tiles.empty() ? "" : ", ") + r.extra["tile"].get<std::string>();
      }
    }
    std::printf("   %s\n", tiles.c_str());
  };
  for (cuda::GemmKernel kernel : benched_kernels(ctx)) {
    const std::string mode = std::string("invariant-") + cuda::gemm_kernel_name(kernel);
    std::printf("\ngemm: invariant time / cuBLASLt time, %s kernel (target <= 1.3)\n",
                cuda::gemm_kernel_name(kernel));
    std::printf("%-14s", "projection");
    for (int rows : kRows) std::printf(" %9s", ("B=" + std::to_string(rows)).c_str());
    std::printf("   %s\n", "tiles (B=1 .. 256)");
    for (const Projection& pr : kV32) ratio_line(mode, pr, pr.name);
  }
  for (const Projection& pr : kV32) {
    if (pr.layout == WeightLayout::kKN) {
      ratio_line("invariant-wgmma-kn-mma", pr, std::string(pr.name) + "*");
    }
  }
  std::puts("(* kKN weights on mma.sync under the wgmma kernel, DSA_CUDA_GEMM_KN=mma)");
  std::puts("(! after a ratio: that run failed its check against cuBLASLt)");
  for (const char* kernel : {"", "-wgmma", "-w8a8"}) {
    std::printf(
        "\ngemm: fp8-weight invariant%s time / bf16 invariant time (the same kernel), and fp8 us "
        "/ floor us\n",
        kernel);
    std::printf("%-14s", "projection");
    for (int rows : kRows) std::printf(" %17s", ("B=" + std::to_string(rows)).c_str());
    std::printf("\n");
    for (const Projection& pr : kV32) {
      if (!pr.fp8) continue;
      std::printf("%-14s", pr.name);
      for (int rows : kRows) {
        const std::string want = std::string("gemm/invariant-fp8w") + kernel + "/" + pr.name +
                                 "/B=" + std::to_string(rows);
        for (const BenchResult& r : ctx.results()) {
          if (r.name != want) continue;
          std::printf(" %5.2f%s %5.1f/%5.1f", r.extra["vs_invariant_bf16"].get<double>(),
                      r.extra["ok"].get<bool>() ? " " : "!", r.us, r.floor_us);
        }
      }
      std::printf("\n");
    }
  }
  std::puts(
      "(! after a ratio: the fp8 run's bits differ from the bf16 run on its dequantized "
      "weights; -w8a8, fp8 x too: against the bf16 wgmma time, ! when its nmse against the "
      "fp8-weight GEMM on the same x is over 1e-2)");
  std::puts("\ngemm: fp8-weight wgmma time / bf16 wgmma time per fp8 tile, B = 1");
  std::printf("%-14s", "projection");
  for (int tile = 0; tile < cuda::gemm_invariant_fp8_tile_count(); ++tile) {
    std::printf(" %15s", cuda::gemm_invariant_fp8_tile_name(tile));
  }
  std::printf("\n");
  for (const Projection& pr : kV32) {
    if (!pr.fp8) continue;
    std::printf("%-14s", pr.name);
    for (int tile = 0; tile < cuda::gemm_invariant_fp8_tile_count(); ++tile) {
      const std::string want = std::string("gemm/invariant-fp8w-tile/") +
                               cuda::gemm_invariant_fp8_tile_name(tile) + "/" + pr.name + "/B=1";
      for (const BenchResult& r : ctx.results()) {
        if (r.name != want) continue;
        std::printf(" %14.2f%s", r.extra["vs_invariant_bf16"].get<double>(),
                    r.extra["ok"].get<bool>() ? " " : "!");
      }
    }
    std::printf("\n");
  }
  std::puts("(! after a ratio: the tile's bits differ from the bf16 wgmma run)");
  std::puts("\ngemm: w8a8 time / bf16 wgmma time per w8a8 tile, B = 1 (us in brackets)");
  std::printf("%-14s", "projection");
  for (int tile = 0; tile < cuda::gemm_invariant_w8a8_tile_count(); ++tile) {
    std::printf(" %22s", cuda::gemm_invariant_w8a8_tile_name(tile));
  }
  std::printf("\n");
  for (const Projection& pr : kV32) {
    if (!pr.fp8) continue;
    std::printf("%-14s", pr.name);
    for (int tile = 0; tile < cuda::gemm_invariant_w8a8_tile_count(); ++tile) {
      const std::string want = std::string("gemm/invariant-fp8w-w8a8-tile/") +
                               cuda::gemm_invariant_w8a8_tile_name(tile) + "/" + pr.name + "/B=1";
      for (const BenchResult& r : ctx.results()) {
        if (r.name != want) continue;
        std::printf(" %12.2f%s (%6.1f)", r.extra["vs_invariant_bf16"].get<double>(),
                    r.extra["ok"].get<bool>() ? " " : "!", r.us);
      }
    }
    std::printf("\n");
  }
  std::puts("(! after a ratio: the tile's bits differ from the default w8a8 tile)");
}

}  // namespace dsa::bench
