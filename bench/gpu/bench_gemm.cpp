// GEMM benches: every projection of a V3.2 layer at B (rows) = 1, 8, 64, 256, the batch-invariant
// tensor-core GEMM (`--gemm invariant`) against cuBLASLt (`--gemm fast`) in the same run.
//   gemm/{invariant,cublaslt}/<projection>/B=<rows>
// Bytes: the bf16 weights once, x read (bf16 when the model hands the GEMM the norm's bf16 copy,
// else f32), y written (and read when accumulating). Floor: max(bytes at the copy bandwidth,
// flops at the cuBLASLt bf16 rate). Both modes are timed the same way: graph-launched back to
// back, weights rotating over > 3x L2 when one set would fit in it. extra.vs_cublaslt is the
// invariant time over the cuBLASLt time of the same shape (the target is <= 1.3).
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dsa/error.h"

namespace dsa::bench {
namespace {

struct Projection {
  const char* name;
  int n, k, batch;
  WeightLayout layout;
  GemmOutput output;
  bool bf16_copy;  // the model passes the producing norm's bf16 copy of x
};

// The v32 preset (hidden 7168, q_lora 1536, 128 heads of 128 + 64, 64 index heads of 128,
// intermediate 18432, vocab 32768), as src/model/model.cpp calls them.
constexpr Projection kV32[] = {
    {"q_a", 1536, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"q_b", 128 * 192, 1536, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"kv_a", 576, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"kv_b_absorb", 512, 128, 128, WeightLayout::kKN, GemmOutput::kOverwrite, false},
    {"kv_b_up", 128, 512, 128, WeightLayout::kNK, GemmOutput::kOverwrite, false},
    {"o", 7168, 128 * 128, 1, WeightLayout::kNK, GemmOutput::kAccumulate, false},
    {"wq_b", 64 * 128, 1536, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"wk", 128, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"weights_proj", 64, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"gate_or_up", 18432, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"down", 7168, 18432, 1, WeightLayout::kNK, GemmOutput::kAccumulate, false},
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

void bench_projection(BenchContext& ctx, const Projection& pr, std::mt19937_64& gen) {
  Backend& be = ctx.backend;
  const int64_t w_elems = int64_t(pr.batch) * pr.n * pr.k;
  const double w_bytes = 2.0 * double(w_elems);
  const int sets = BenchContext::rotation_sets(w_bytes);
  DeviceArray<Bf16> w(be, size_t(w_elems) * sets);
  fill_random(be, w.data(), w.bytes(), gen);
  const int max_rows = kRows[std::size(kRows) - 1];
  const int64_t x_elems = int64_t(pr.batch) * max_rows * pr.k;
  DeviceArray<float> x(be, size_t(x_elems)), y(be, size_t(pr.batch) * max_rows * pr.n);
  DeviceArray<Bf16> xb(be, size_t(x_elems));
  fill_random(be, x.data(), x.bytes(), gen);
  fill_random(be, xb.data(), xb.bytes(), gen);
  be.fill(y.data(), 0, y.bytes());

  for (int rows : kRows) {
    GemmParams p;
    p.x = x.data();
    p.y = y.data();
    p.m = rows, p.n = pr.n, p.k = pr.k, p.batch = pr.batch;
    p.layout = pr.layout;
    p.output = pr.output;
    p.ld_x = pr.k;
    p.ld_w = pr.layout == WeightLayout::kNK ? pr.k : pr.n;
    p.ld_y = pr.n;
    p.batch_stride_x = int64_t(rows) * pr.k;
    p.batch_stride_w = int64_t(pr.n) * pr.k;
    p.batch_stride_y = int64_t(rows) * pr.n;
    if (pr.bf16_copy) p.x_bf16 = xb.data(), p.ld_x_bf16 = pr.k;
    const double x_bytes = double(pr.batch) * rows * pr.k * (pr.bf16_copy ? 2 : 4);
    const double y_bytes =
        4.0 * pr.batch * rows * pr.n * (pr.output == GemmOutput::kAccumulate ? 2 : 1);
    const double bytes = w_bytes + x_bytes + y_bytes;
    const double flops = 2.0 * pr.batch * rows * double(pr.n) * pr.k;
    const double floor_us = std::max(ctx.hbm_floor_us(bytes), ctx.bf16_floor_us(flops));
    double us[2] = {0, 0};
    const GemmMode modes[2] = {GemmMode::kBatchInvariant, GemmMode::kFast};
    for (int i = 0; i < 2; ++i) {
      be.set_gemm_mode(modes[i]);
      int call = 0;
      us[i] = ctx.time_graph_us(
          [&] {
            GemmParams q = p;
            q.w = w.data() + (call++ % sets) * w_elems;
            be.gemm(q);
          },
          std::max(2 * sets, 20));
    }
    be.set_gemm_mode(GemmMode::kBatchInvariant);
    for (int i = 0; i < 2; ++i) {
      BenchResult r;
      r.name = std::string("gemm/") + (i == 0 ? "invariant/" : "cublaslt/") + pr.name +
               "/B=" + std::to_string(rows);
      r.us = us[i];
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
                 {"vs_cublaslt", us[0] / us[1]}};
      ctx.add(std::move(r));
    }
  }
}

}  // namespace

void run_gemm_benches(BenchContext& ctx) {
  std::mt19937_64 gen(77);
  std::puts("gemm benches: invariant (tensor cores, bf16 x) vs cuBLASLt");
  for (const Projection& pr : kV32) bench_projection(ctx, pr, gen);
  std::puts("\ngemm: invariant time / cuBLASLt time (target <= 1.3)");
  std::printf("%-14s", "projection");
  for (int rows : kRows) std::printf(" %9s", ("B=" + std::to_string(rows)).c_str());
  std::puts("");
  for (const Projection& pr : kV32) {
    std::printf("%-14s", pr.name);
    for (int rows : kRows) {
      const std::string want =
          std::string("gemm/invariant/") + pr.name + "/B=" + std::to_string(rows);
      for (const BenchResult& r : ctx.results()) {
        if (r.name == want) std::printf(" %9.2f", r.extra["vs_cublaslt"].get<double>());
      }
    }
    std::puts("");
  }
}

}  // namespace dsa::bench
