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
//
// --gemm-sweep instead times every tile configuration and split count of the invariant GEMM
// (GemmInvariantTuning) per projection and B, each run checked before it counts, and prints per
// projection the split count (one for all B) and tiles with the least worst ratio to cuBLASLt,
// as kShapeTable lines for src/backend/cuda/gemm_invariant.cu:
//   gemm-sweep/<projection>/B=<rows>/<tile>/s=<splits>[/reduce-kernel]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "bench_util.h"
#include "dsa/error.h"

namespace dsa::bench {
namespace {

struct Projection {
  const char* name;
  int n, k, batch;
  WeightLayout layout;
  GemmOutput output;
  bool bf16_copy;    // the model passes the producing norm's bf16 copy of x
  bool fp8 = false;  // the model keeps it in fp8 under --weights fp8 (weight_kept_fp8)
};

// The v32 preset (hidden 7168, q_lora 1536, 128 heads of 128 + 64, 64 index heads of 128,
// intermediate 18432, vocab 32768), as src/model/model.cpp calls them.
constexpr Projection kV32[] = {
    {"q_a", 1536, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
    {"q_b", 128 * 192, 1536, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
    {"kv_a", 576, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
    {"kv_b_absorb", 512, 128, 128, WeightLayout::kKN, GemmOutput::kOverwrite, false},
    {"kv_b_up", 128, 512, 128, WeightLayout::kNK, GemmOutput::kOverwrite, false},
    {"o", 7168, 128 * 128, 1, WeightLayout::kNK, GemmOutput::kAccumulate, false, true},
    {"wq_b", 64 * 128, 1536, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
    {"wk", 128, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
    {"weights_proj", 64, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"gate_or_up", 18432, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
    {"down", 7168, 18432, 1, WeightLayout::kNK, GemmOutput::kAccumulate, false, true},
    {"lm_head", 32768, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
};
constexpr int kRows[] = {1, 8, 64, 256};

void fill_random(Backend& be, void* dst, size_t bytes, std::mt19937_64& gen) {
  // Small finite bf16 (and f32 halves): bytes 0x3c / 0x3d with random low bytes.
  std::vector<uint8_t> block(size_t(1) << 22);
  for (size_t i = 0; i < block.size(); ++i)
    block[i] = i % 2 ? uint8_t(0x3c + gen() % 2) : uint8_t(gen());
  for (size_t done = 0; done < bytes; done += block.size()) {
    be.copy_to_device(static_cast<uint8_t*>(dst) + done, block.data(),
                      std::min(block.size(), bytes - done));
  }
  be.synchronize();
}

constexpr double kSweepNmse = 1e-7;  // cuBLASLt and the invariant GEMM differ in order only

// The invariant GEMM's kernels, each timed and checked against cuBLASLt (--gemm-kernels).
constexpr cuda::GemmKernel kKernels[] = {cuda::GemmKernel::kMma, cuda::GemmKernel::kWgmma};
std::vector<cuda::GemmKernel> benched_kernels(const BenchContext& ctx) {
  std::vector<cuda::GemmKernel> out;
  for (cuda::GemmKernel kernel : kKernels) {
    const std::string name = cuda::gemm_kernel_name(kernel);
    if (ctx.gemm_kernels.empty() || std::find(ctx.gemm_kernels.begin(), ctx.gemm_kernels.end(),
                                              name) != ctx.gemm_kernels.end()) {
      out.push_back(kernel);
    }
  }
  return out;
}

// One projection's device buffers: weights rotating over `sets` copies, x (f32 and bf16) and y
// with room for the largest B.
struct ProjectionBuffers {
  // fp8: make the fp8 weights too (pr.fp8 projections; the sweep times bf16 only).
  ProjectionBuffers(Backend& be, const Projection& pr, std::mt19937_64& gen, bool fp8 = false)
      : w_elems(int64_t(pr.batch) * pr.n * pr.k),
        sets(BenchContext::rotation_sets(2.0 * double(w_elems))),
        w(be, size_t(w_elems) * sets),
        x(be, size_t(pr.batch) * kMaxRows * pr.k),
        y(be, size_t(pr.batch) * kMaxRows * pr.n),
        xb(be, size_t(pr.batch) * kMaxRows * pr.k) {
    fill_random(be, w.data(), w.bytes(), gen);
    fill_random(be, x.data(), x.bytes(), gen);
    fill_random(be, xb.data(), xb.bytes(), gen);
    be.fill(y.data(), 0, y.bytes());
    if (fp8 && pr.fp8) make_fp8(be, pr, gen);
  }
  // fp8 weights rotating over sets8 copies of one random matrix (codes of magnitude < 2, no NaN;
  // scales near 2^-6), and its dequantized bf16 values in bf16 set 0.
  void make_fp8(Backend& be, const Projection& pr, std::mt19937_64& gen) {
    scale_cols = (pr.k + kGemmFp8Block - 1) / kGemmFp8Block;
    scale_elems = int64_t((pr.n + kGemmFp8Block - 1) / kGemmFp8Block) * scale_cols;
    sets8 = BenchContext::rotation_sets(double(w_elems) + 4.0 * double(scale_elems));
    w8 = DeviceArray<uint8_t>(be, size_t(w_elems) * sets8);
    w8_scale = DeviceArray<float>(be, size_t(scale_elems) * sets8);
    std::vector<uint8_t> q(static_cast<size_t>(w_elems));
    for (uint8_t& b : q) b = uint8_t(gen()) & 0xBF;  // exponent < 8: |v| < 2, never NaN
    std::vector<float> scales(static_cast<size_t>(scale_elems));
    for (float& v : scales) v = std::ldexp(1.0f + float(gen() % 64) / 64.0f, -6);
    for (int s = 0; s < sets8; ++s) {
      be.copy_to_device(w8.data() + size_t(s) * w_elems, q.data(), q.size());
      be.copy_to_device(w8_scale.data() + size_t(s) * scale_elems, scales.data(),
                        scales.size() * sizeof(float));
    }
    std::vector<Bf16> dq(q.size());
    for (int64_t r = 0; r < pr.n; ++r) {
      for (int64_t c = 0; c < pr.k; ++c) {
        const float scale = scales[size_t(r / kGemmFp8Block * scale_cols + c / kGemmFp8Block)];
        dq[size_t(r * pr.k + c)] = dequant_fp8_weight(Fp8E4M3{q[size_t(r * pr.k + c)]}, scale);
      }
    }
    be.copy_to_device(w.data(), dq.data(), dq.size() * sizeof(Bf16));
    be.synchronize();
  }
  static constexpr int kMaxRows = kRows[std::size(kRows) - 1];
  int64_t w_elems;
  int sets;
  DeviceArray<Bf16> w;
  DeviceArray<float> x, y;
  DeviceArray<Bf16> xb;
  int sets8 = 0;  // fp8 weights (pr.fp8 only)
  int64_t scale_cols = 0, scale_elems = 0;
  DeviceArray<uint8_t> w8;
  DeviceArray<float> w8_scale;
};

// The call with the fp8 weights of set 0 instead of the bf16 ones.
GemmParams with_fp8(GemmParams p, const ProjectionBuffers& buf) {
  p.w = nullptr;
  p.w_fp8 = buf.w8.data();
  p.w_scale = buf.w8_scale.data();
  p.ld_w_scale = buf.scale_cols;
  return p;
}

// The call the model makes for `rows` rows (weights: the first set; callers rotate them).
GemmParams projection_params(const Projection& pr, int rows, const ProjectionBuffers& buf) {
  GemmParams p;
  p.x = buf.x.data();
  p.w = buf.w.data();
  p.y = buf.y.data();
  p.m = rows, p.n = pr.n, p.k = pr.k, p.batch = pr.batch;
  p.layout = pr.layout;
  p.output = pr.output;
  p.ld_x = pr.k;
  p.ld_w = pr.layout == WeightLayout::kNK ? pr.k : pr.n;
  p.ld_y = pr.n;
  p.batch_stride_x = int64_t(rows) * pr.k;
  p.batch_stride_w = int64_t(pr.n) * pr.k;
  p.batch_stride_y = int64_t(rows) * pr.n;
  if (pr.bf16_copy) p.x_bf16 = buf.xb.data(), p.ld_x_bf16 = pr.k;
  return p;
}

// Median microseconds of the call p, graph-launched `calls` times back to back with the weights
// rotating over the buffers' sets.
double time_projection(BenchContext& ctx, const GemmParams& p, const ProjectionBuffers& buf,
                       int calls) {
  int call = 0;
  return ctx.time_graph_us(
      [&] {
        GemmParams q = p;
        if (p.w_fp8) {
          const int set = call++ % buf.sets8;
          q.w_fp8 = buf.w8.data() + set * buf.w_elems;
          q.w_scale = buf.w8_scale.data() + set * buf.scale_elems;
        } else {
          q.w = buf.w.data() + (call++ % buf.sets) * buf.w_elems;
        }
        ctx.backend.gemm(q);
      },
      calls);
}

std::vector<float> read_y(Backend& be, const ProjectionBuffers& buf, size_t floats) {
  std::vector<float> out(floats);
  be.copy_to_host(out.data(), buf.y.data(), floats * sizeof(float));
  return out;
}

// y after one call of p on y = 0 (an accumulating projection then holds alpha * x w alone).
std::vector<float> run_on_zero(Backend& be, const GemmParams& p, const ProjectionBuffers& buf) {
  const size_t floats = size_t(p.batch) * p.m * p.n;
  be.fill(buf.y.data(), 0, floats * sizeof(float));
  be.gemm(p);
  return read_y(be, buf, floats);
}

double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - ref[i];
    num += d * d, den += double(ref[i]) * ref[i];
  }
  return std::isfinite(num) ? num / std::max(den, 1e-300) : 1e300;
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
    // [kernel]: time, nmse against cuBLASLt (the same bf16 inputs; only the order differs).
    const std::vector<cuda::GemmKernel> kernels = benched_kernels(ctx);
    std::vector<double> us(kernels.size()), err(kernels.size());
    be.set_gemm_mode(GemmMode::kBatchInvariant);
    for (size_t i = 0; i < kernels.size(); ++i) {
      cuda::GemmInvariantTuning tuning;
      tuning.kernel = kernels[i];
      set_gemm_invariant_tuning(be, tuning);
      err[i] = nmse(run_once(), ref);
      us[i] = time_projection(ctx, p, buf, std::max(2 * sets, 20));
      if (!(err[i] <= kSweepNmse)) {
        std::printf("  GEMM CHECK FAILED %s B=%d %s: nmse %.3g against cuBLASLt\n", pr.name, rows,
                    cuda::gemm_kernel_name(kernels[i]), err[i]);
      }
    }
    set_gemm_invariant_tuning(be, {});
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
      cuda::GemmInvariantTuning tuning;
      tuning.kernel = kernels[i];
      const bool own = pr.layout == WeightLayout::kNK || kernels[i] == cuda::GemmKernel::kMma;
      add(std::string("invariant-") + cuda::gemm_kernel_name(kernels[i]), us[i],
          {{"vs_cublaslt", us[i] / cublas_us},
           {"nmse_vs_cublaslt", err[i]},
           {"ok", err[i] <= kSweepNmse},
           {"tile",
            own ? cuda::gemm_invariant_tile_name(
                      cuda::gemm_invariant_tile(rows, pr.n, pr.k, pr.batch, tuning), kernels[i])
                : "mma fallback (kKN)"}});
    }
    add("cublaslt", cublas_us, nlohmann::json::object());
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
      BenchResult r;
      r.name = std::string("gemm/invariant-fp8w") + (wgmma ? "-wgmma/" : "/") + pr.name +
               "/B=" + std::to_string(rows);
      r.us = fp8_us;
      r.bytes = bytes8;
      r.flops = flops;
      r.floor_us = std::max(ctx.hbm_floor_us(bytes8), ctx.bf16_floor_us(flops));
      r.floor_kind = ctx.hbm_floor_us(bytes8) >= ctx.bf16_floor_us(flops) ? "hbm" : "bf16";
      r.extra = {{"n", pr.n},
                 {"k", pr.k},
                 {"rows", rows},
                 {"sets", buf.sets8},
                 {"bf16_copy", pr.bf16_copy},
                 {"splits", cuda::gemm_invariant_splits(pr.n, pr.k, pr.batch, {})},
                 {"tile", wgmma ? cuda::gemm_invariant_fp8_tile_name(
                                      cuda::gemm_invariant_fp8_tile(rows, tuning))
                                : cuda::gemm_invariant_tile_name(cuda::gemm_invariant_tile(
                                      rows, pr.n, pr.k, pr.batch, tuning))},
                 {"vs_cublaslt", fp8_us / cublas_us},
                 {"invariant_bf16_us", bf16_us},
                 {"vs_invariant_bf16", fp8_us / bf16_us},
                 {"ok", same}};
      ctx.add(std::move(r));
    }
  }
}

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
                      double deadline_s, cuda::GemmKernel kernel, std::vector<SweepCell>& cells) {
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

void run_gemm_benches(BenchContext& ctx) {
  std::mt19937_64 gen(77);
  std::puts("gemm benches: invariant (tensor cores, bf16 x; mma.sync and wgmma) vs cuBLASLt");
  for (const Projection& pr : kV32) bench_projection(ctx, pr, gen);
  for (cuda::GemmKernel kernel : benched_kernels(ctx)) {
    const std::string mode = std::string("invariant-") + cuda::gemm_kernel_name(kernel);
    std::printf("\ngemm: invariant time / cuBLASLt time, %s kernel (target <= 1.3)\n",
                cuda::gemm_kernel_name(kernel));
    std::printf("%-14s", "projection");
    for (int rows : kRows) std::printf(" %9s", ("B=" + std::to_string(rows)).c_str());
    std::printf("   %s\n", "tiles (B=1 .. 256)");
    for (const Projection& pr : kV32) {
      std::printf("%-14s", pr.name);
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
    }
  }
  std::puts("(! after a ratio: that run failed its check against cuBLASLt)");
  for (const char* kernel : {"", "-wgmma"}) {
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
      "weights)");
}

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
    sweep_projection(ctx, *swept[i], gen, deadline_s, kernel, cells);
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
        out +=
            names
                ? "\"" +
                      std::string(cuda::gemm_invariant_tile_name(t[c], cuda::GemmKernel::kWgmma)) +
                      "\""
                : std::to_string(t[c]);
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
