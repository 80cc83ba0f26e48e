// What the GEMM benches (bench_gemm.cpp) and the GEMM sweep (bench_gemm_sweep.cpp) share: the
// V3.2 projections, their device buffers, the call the model makes and its timing and checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "bench_util.h"

namespace dsa::bench::gemm {

struct Projection {
  const char* name;
  int n, k, batch;
  WeightLayout layout;
  GemmOutput output;
  bool bf16_copy;    // the model passes the producing norm's bf16 copy of x
  bool fp8 = false;  // the model keeps it in fp8 under --weights fp8 (weight_kept_fp8)
};

// The v32 preset (hidden 7168, q_lora 1536, 128 heads of 128 + 64, 64 index heads of 128,
// intermediate 18432, vocab 32768). src/model/model.cpp calls x_proj (q_a ‖ wk ‖ kv_a ‖
// weights_proj with bf16 weights; without weights_proj, x_proj_fp8w, with fp8 ones), q_up
// (q_b ‖ wq_b) and gate_up (gate ‖ up), fused since 2026-12-04; their parts stay in the table for
// the comparison.
constexpr Projection kV32[] = {
    {"x_proj", 1536 + 128 + 576 + 64, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true},
    {"x_proj_fp8w", 1536 + 128 + 576, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true,
     true},
    {"q_up", 128 * 192 + 64 * 128, 1536, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
    {"gate_up", 2 * 18432, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, true, true},
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

inline void fill_random(Backend& be, void* dst, size_t bytes, std::mt19937_64& gen) {
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
inline std::vector<cuda::GemmKernel> benched_kernels(const BenchContext& ctx) {
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
inline GemmParams with_fp8(GemmParams p, const ProjectionBuffers& buf) {
  p.w = nullptr;
  p.w_fp8 = buf.w8.data();
  p.w_scale = buf.w8_scale.data();
  p.ld_w_scale = buf.scale_cols;
  return p;
}

// The call the model makes for `rows` rows (weights: the first set; callers rotate them).
inline GemmParams projection_params(const Projection& pr, int rows, const ProjectionBuffers& buf) {
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
inline double time_projection(BenchContext& ctx, const GemmParams& p, const ProjectionBuffers& buf,
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

inline std::vector<float> read_y(Backend& be, const ProjectionBuffers& buf, size_t floats) {
  std::vector<float> out(floats);
  be.copy_to_host(out.data(), buf.y.data(), floats * sizeof(float));
  return out;
}

// y after one call of p on y = 0 (an accumulating projection then holds alpha * x w alone).
inline std::vector<float> run_on_zero(Backend& be, const GemmParams& p,
                                      const ProjectionBuffers& buf) {
  const size_t floats = size_t(p.batch) * p.m * p.n;
  be.fill(buf.y.data(), 0, floats * sizeof(float));
  be.gemm(p);
  return read_y(be, buf, floats);
}

inline double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - ref[i];
    num += d * d, den += double(ref[i]) * ref[i];
  }
  return std::isfinite(num) ? num / std::max(den, 1e-300) : 1e300;
}

}  // namespace dsa::bench::gemm
