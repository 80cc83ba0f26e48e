// Parity of the batch-invariant tensor-core GEMM (GemmMode::kBatchInvariant), both kernels:
// mma.sync (gemm_tensor.cu) and wgmma (gemm_wgmma.cu), each forced through the tuning and each
// held to everything below on its own (they give different bits from each other).
//
// The kernel rounds x to bf16 and sums in another order than the CPU reference (cpu/gemm.cpp:
// f32 x, one sequential f32 sum), so it is compared within a derived bound, not bit for bit.
// For one output element with s = sum_k x_k w_k and A = sum_k |x_k| |w_k|:
//   - bf16(x_k) = x_k (1 + d_k) with |d_k| <= 2^-8 (round to nearest, 8 significant bits), and
//     the products bf16(x_k) w_k are exact in f32, so rounding x moves s by <= 2^-8 A;
//   - each f32 sum of K terms, in any order, is within about K u A of the exact one (u = 2^-24);
//     the CPU's sequential sum, the tensor cores' chained mma (whose internal additions may
//     truncate: allowed 2 u each) and the split-K reduction together stay below (K + 2) 2^-21 A;
//   - alpha and the accumulate add round once more on each side: 2^-22 (|y| + |alpha| A).
//   |gpu - cpu| <= |alpha| (2^-8 + (K + 2) 2^-21) A + 2^-22 (|y_cpu| + |y_0| + |alpha| A)
// A worst-case bound cannot see one lost product out of thousands, so two statistical checks
// sit beside it, per checked row: nmse against the CPU <= 1e-4 (bf16 rounding of x alone gives
// about 2^-16 / 3), and nmse against a second CPU reference computed on bf16(x) (DeepGEMM's
// trick: it removes the quantization error and leaves only the summation order) <= 1e-7. One
// lost k16 block at K = 16384 costs an nmse near 1e-3, one lost product about 6e-5.
//
// Batch invariance is checked bit for bit: every row of a run with m rows against the same row
// of the largest run, and one probe row placed alone, among 7 and among 255 rows of garbage, at
// several positions and at every graph bucket of the runner. Outputs outside [m, n) and 256
// guard bytes around every buffer must come back byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "common/restore_env.h"
#include "common/test_util.h"
#include "dsa/backend.h"
#include "dsa/error.h"
#include "dsa/runner.h"
#include "parity/gemm_guarded.h"

namespace dsa::parity {
namespace {

constexpr double kNmseCpu = 1e-4, kNmseBf16Ref = 1e-7;

struct Shape {
  std::string name;
  int n, k, batch = 1;
  WeightLayout layout = WeightLayout::kNK;
  GemmOutput output = GemmOutput::kOverwrite;
  float alpha = 1.0f;
  int pad_x = 0, pad_w = 0, pad_y = 0;  // extra elements per row (odd pads: unaligned rows)
};

// One GEMM problem with room for max_m rows per batch entry: x [batch][max_m][ld_x], w
// [batch][rows_w][ld_w], y [batch][max_m + 2][ld_y]. A run with m rows uses the first m rows of
// every entry; the rest of y (rows >= m, columns >= n) must stay as it was written.
class Problem {
 public:
  Problem(const Shape& s, int max_m, uint64_t seed) : s_(s), max_m_(max_m) {
    ld_x_ = s.k + s.pad_x;
    ld_w_ = (s.layout == WeightLayout::kNK ? s.k : s.n) + s.pad_w;
    ld_y_ = s.n + s.pad_y;
    rows_w_ = s.layout == WeightLayout::kNK ? s.n : s.k;
    w_.resize(size_t(s.batch) * rows_w_ * ld_w_);
    for (size_t i = 0; i < w_.size(); ++i) w_[i] = float_to_bf16(hashed(seed, i, 0.25f));
    x_.resize(size_t(s.batch) * max_m * ld_x_);
    for (size_t i = 0; i < x_.size(); ++i) x_[i] = hashed(seed + 1, i, 2.0f);
    y0_.assign(size_t(s.batch) * (max_m + 2) * ld_y_, testing::kPoison);
    for (int b = 0; b < s.batch; ++b) {
      for (int r = 0; r < max_m; ++r) {
        for (int c = 0; c < s.n; ++c) {
          const size_t at = y_index(b, r, c);
          if (s.output == GemmOutput::kAccumulate) y0_[at] = hashed(seed + 2, at, 3.0f);
        }
      }
    }
  }

  const Shape& shape() const { return s_; }
  int max_m() const { return max_m_; }
  // For tests that plant garbage rows and move the probe's accumulate input (the CPU rows made
  // so far no longer hold).
  std::vector<float>& x() { return cpu_cache_.clear(), x_; }
  std::vector<float>& y0() { return cpu_cache_.clear(), y0_; }
  size_t x_index(int b, int r) const { return (size_t(b) * max_m_ + r) * ld_x_; }
  size_t y_index(int b, int r, int c) const { return (size_t(b) * (max_m_ + 2) + r) * ld_y_ + c; }

  GemmParams params(int m) const {
    GemmParams p;
    p.m = m, p.n = s_.n, p.k = s_.k, p.batch = s_.batch;
    p.ld_x = ld_x_, p.ld_w = ld_w_, p.ld_y = ld_y_;
    p.batch_stride_x = int64_t(max_m_) * ld_x_;
    p.batch_stride_w = int64_t(rows_w_) * ld_w_;
    p.batch_stride_y = int64_t(max_m_ + 2) * ld_y_;
    p.layout = s_.layout;
    p.output = s_.output;
    p.alpha = s_.alpha;
    return p;
  }

  // The weights on the device (after the first run_cuda; null before).
  const Bf16* device_w() const {
    return w_dev_ ? static_cast<const Bf16*>(w_dev_->data()) : nullptr;
  }

  // y after one CUDA run with m rows in `mode`; with_bf16_copy passes bf16(x) as p.x_bf16 (the
  // norms' fused copy, batch 1 only). Adds failures for changed guards or bytes outside the
  // output.
  std::vector<float> run_cuda(Backend& cuda, GemmMode mode, int m, bool with_bf16_copy = false) {
    if (!w_dev_) {  // the weights go up once per problem (the largest is 470 MB)
      w_dev_ = std::make_unique<Guarded>(cuda, w_.size() * 2);
      w_dev_->write(w_.data());
    }
    Guarded& w = *w_dev_;
    Guarded x(cuda, x_.size() * 4), y(cuda, y0_.size() * 4), xb(cuda, x_.size() * 2);
    x.write(x_.data());
    y.write(y0_.data());
    std::vector<Bf16> x16(x_.size());
    for (size_t i = 0; i < x_.size(); ++i) x16[i] = float_to_bf16(x_[i]);
    xb.write(x16.data());
    GemmParams p = params(m);
    p.x = static_cast<const float*>(x.data());
    p.w = static_cast<const Bf16*>(w.data());
    p.y = static_cast<float*>(y.data());
    if (with_bf16_copy) {
      p.x_bf16 = static_cast<const Bf16*>(xb.data());
      p.ld_x_bf16 = ld_x_;
    }
    cuda.set_gemm_mode(mode);
    cuda.gemm(p);
    cuda.synchronize();
    const std::string what = s_.name + " m=" + std::to_string(m);
    x.read(what + " x"), w.read(what + " w"), xb.read(what + " x_bf16");
    const std::vector<uint8_t> bytes = y.read(what + " y");
    std::vector<float> out(y0_.size());
    std::memcpy(out.data(), bytes.data(), bytes.size());
    size_t changed = 0, first = 0;
    for (int b = 0; b < s_.batch; ++b) {
      for (int r = 0; r < max_m_ + 2; ++r) {
        for (int c = 0; c < ld_y_; ++c) {
          if (r < m && c < s_.n) continue;
          const size_t at = y_index(b, r, c);
          if (std::memcmp(&out[at], &y0_[at], 4) != 0 && changed++ == 0) first = at;
        }
      }
    }
    EXPECT_EQ(changed, 0u) << what << ": " << changed
                           << " floats outside the m x n output changed, first at " << first;
    return out;
  }

  // Checks row r of batch entry b of a CUDA result against the CPU (see the file comment).
  void expect_row_matches_cpu(Backend& cpu, const std::vector<float>& gpu, int b, int r,
                              const std::string& what) {
    const std::vector<float>& ref = cpu_row(cpu, b, r, RowInput::kAsIs);
    const std::vector<float>& ref_b = cpu_row(cpu, b, r, RowInput::kBf16);
    const std::vector<float>& abs_sum = cpu_row(cpu, b, r, RowInput::kAbs);
    const double u_bf16 = std::ldexp(1.0, -8), sum_err = (s_.k + 2) * std::ldexp(1.0, -21);
    const double alpha = std::fabs(double(s_.alpha)), last = std::ldexp(1.0, -22);
    double num = 0, num_b = 0, den = 0, den_b = 0;
    int bad = 0;
    std::string first;
    for (int c = 0; c < s_.n; ++c) {
      const double g = gpu[y_index(b, r, c)], e = ref[c], a = abs_sum[c] * (1 + 1e-3);
      const double y0 = s_.output == GemmOutput::kAccumulate ? std::fabs(y0_[y_index(b, r, c)]) : 0;
      const double bound =
          alpha * (u_bf16 + sum_err) * a + last * (std::fabs(e) + y0 + alpha * a) + 1e-30;
      if (!std::isfinite(g) || std::fabs(g - e) > bound) {
        if (bad++ == 0) {
          first = "column " + std::to_string(c) + ": cuda " + std::to_string(g) + ", cpu " +
                  std::to_string(e) + ", bound " + std::to_string(bound);
        }
      }
      num += (g - e) * (g - e), den += e * e;
      num_b += (g - ref_b[c]) * (g - ref_b[c]), den_b += double(ref_b[c]) * ref_b[c];
    }
    const std::string at = what + " batch " + std::to_string(b) + " row " + std::to_string(r);
    EXPECT_EQ(bad, 0) << at << ": " << bad << " elements past the bound; first " << first;
    EXPECT_LE(num / std::max(den, 1e-300), kNmseCpu) << at << ": nmse against the CPU";
    EXPECT_LE(num_b / std::max(den_b, 1e-300), kNmseBf16Ref)
        << at << ": nmse against the CPU on bf16(x)";
  }

 private:
  enum class RowInput { kAsIs, kBf16, kAbs };

  // The CPU reference for one row (m = 1), on x as is, on bf16(x), or sum |x| |w| (alpha 1);
  // made once per row while x and y0 stay as they are (both kernels check the same rows).
  const std::vector<float>& cpu_row(Backend& cpu, int b, int r, RowInput input) {
    const auto key = std::make_tuple(b, r, int(input));
    if (const auto it = cpu_cache_.find(key); it != cpu_cache_.end()) return it->second;
    std::vector<float> xr(x_.begin() + x_index(b, r), x_.begin() + x_index(b, r) + s_.k);
    const size_t w_offset = size_t(b) * rows_w_ * ld_w_;
    const Bf16* w = w_.data() + w_offset;
    if (input == RowInput::kBf16) {
      for (float& v : xr) v = round_bf16(v);
    } else if (input == RowInput::kAbs) {
      for (float& v : xr) v = std::fabs(v);
      if (w_abs_.empty()) {  // |w|, made once per problem
        w_abs_ = w_;
        for (Bf16& v : w_abs_) v.bits &= 0x7FFF;
      }
      w = w_abs_.data() + w_offset;
    }
    std::vector<float> y(s_.n);
    for (int c = 0; c < s_.n; ++c) y[c] = y0_[y_index(b, r, c)];
    GemmParams p = params(1);
    p.batch = 1;
    p.x = xr.data(), p.ld_x = s_.k;
    p.w = w;
    p.y = y.data(), p.ld_y = s_.n;
    if (input == RowInput::kAbs) p.alpha = 1.0f, p.output = GemmOutput::kOverwrite;
    cpu.gemm(p);
    return cpu_cache_[key] = std::move(y);
  }

  Shape s_;
  int max_m_;
  int64_t ld_x_, ld_w_, ld_y_, rows_w_;
  std::vector<Bf16> w_, w_abs_;
  std::vector<float> x_, y0_;
  std::unique_ptr<Guarded> w_dev_;
  std::map<std::tuple<int, int, int>, std::vector<float>> cpu_cache_;  // (b, r, input)
};

// Rows [0, m) of every batch entry of `small` equal those of `big`, bit for bit.
::testing::AssertionResult same_rows(const Problem& pr, const std::vector<float>& small,
                                     const std::vector<float>& big, int m) {
  for (int b = 0; b < pr.shape().batch; ++b) {
    for (int r = 0; r < m; ++r) {
      const size_t at = pr.y_index(b, r, 0);
      if (std::memcmp(&small[at], &big[at], size_t(pr.shape().n) * 4) != 0) {
        return ::testing::AssertionFailure()
               << pr.shape().name << ": batch " << b << " row " << r << " differs at m=" << m
               << " from the same row in the largest run";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr cuda::GemmKernel kKernels[] = {cuda::GemmKernel::kMma, cuda::GemmKernel::kWgmma};
// GemmInvariantTuning::reduce's ways, each forced (2 falls back to 3 where it cannot run).
constexpr int kReductions[] = {0, 1, 2, 3};
const char* reduction_label(int reduce) {
  switch (reduce) {
    case 0:
      return ", reduce kernel";
    case 1:
      return ", fused reduction";
    case 2:
      return ", cluster reduction";
    default:
      return ", reduction through L2";
  }
}

std::string kernel_label(cuda::GemmKernel kernel) {
  return std::string(" [") + cuda::gemm_kernel_name(kernel) + "]";
}

class ParityGemm : public GemmParityTest {
 protected:
  // Forces `kernel` (the default tile and split plan) for the runs that follow.
  void use(cuda::GemmKernel kernel) {
    cuda::GemmInvariantTuning tuning;
    tuning.kernel = kernel;
    set_gemm_invariant_tuning(*cuda_, tuning);
  }
  // For each kernel: runs every m of `ms` (ascending), checks the last row of each run (every
  // row when check_all_rows) against the CPU and every run's rows against the largest run
  // bitwise, so a row checked in one run is checked in all.
  void check_shape(const Shape& s, const std::vector<int>& ms, bool check_all_rows) {
    Problem pr(s, ms.back(), 1000 + uint64_t(s.n) * 7 + uint64_t(s.k));
    for (cuda::GemmKernel kernel : kKernels) {
      use(kernel);
      const std::string label = kernel_label(kernel);
      const std::vector<float> big = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, ms.back());
      for (int m : ms) {
        const std::vector<float> y =
            m == ms.back() ? big : pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
        EXPECT_TRUE(same_rows(pr, y, big, m)) << label;
        std::vector<int> rows;
        if (check_all_rows) {
          for (int r = 0; r < m; ++r) rows.push_back(r);
        } else {
          rows = {m - 1};  // m = 1 first: rows 0, 1, 6, 7, 8, 63, 254, 255 of the V3.2 ms
        }
        for (int b : {0, s.batch - 1}) {
          for (size_t i = 0; i < rows.size(); ++i) {
            if (i > 0 && rows[i] == rows[i - 1]) continue;
            pr.expect_row_matches_cpu(*cpu_, y, b, rows[i],
                                      s.name + " m=" + std::to_string(m) + label);
          }
          if (s.batch == 1) break;
        }
        if (HasFailure()) return;  // one shape's first failure says enough
      }
    }
  }

  // kKN weights of s on the wgmma kernel's bulk-copy tiles (KnWeightsOnWgmmaTiles below).
  void check_kn_wgmma(const Shape& s) {
    auto tune = [&](int tile, int reduce) {
      cuda::GemmInvariantTuning t;
      t.kernel = cuda::GemmKernel::kWgmma, t.kn = 1, t.kn_tile = tile, t.reduce = reduce;
      set_gemm_invariant_tuning(*cuda_, t);
      return t;
    };
    const std::vector<int> ms = {1, 7, 64, 130};
    Problem pr(s, ms.back(), 57 + uint64_t(s.n));
    tune(-1, -1);
    const std::vector<float> big = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, ms.back());
    GemmParams uploaded = pr.params(1);  // the routing test reads w's address (alignment)
    uploaded.w = pr.device_w();
    ASSERT_TRUE(cuda::gemm_invariant_kn_runs_wgmma(uploaded, tune(-1, -1))) << s.name;
    for (int m : ms) {
      tune(-1, -1);
      const std::vector<float> y =
          m == ms.back() ? big : pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
      EXPECT_TRUE(same_rows(pr, y, big, m)) << " [wgmma kKN]";
      for (int b : {0, s.batch - 1}) {
        for (int r : {0, m - 1}) {
          pr.expect_row_matches_cpu(*cpu_, y, b, r, s.name + " m=" + std::to_string(m) + " kKN");
        }
      }
      for (int tile = 0; m != 7 && tile < cuda::gemm_invariant_kn_tile_count(); ++tile) {
        for (int reduce : kReductions) {
          tune(tile, reduce);
          const std::vector<float> got = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
          EXPECT_EQ(std::memcmp(got.data(), y.data(), got.size() * 4), 0)
              << s.name << " m=" << m << " kKN tile " << cuda::gemm_invariant_kn_tile_name(tile)
              << reduction_label(reduce) << " differs from the default";
        }
      }
      if (HasFailure()) return;
    }
    tune(-1, -1);
    check_probe(s, {{1, 0}, {7, 3}, {255, 200}}, " [wgmma kKN]");
  }

  struct Placement {
    int m, position;
  };
  // The probe row (row 0 of the clean x) at each placement among rows of large garbage: its
  // output row is the same bits every time, and within the bound of the CPU.
  void check_probe(const Shape& s, const std::vector<Placement>& placements,
                   const std::string& label) {
    Problem pr(s, 256, 4242);
    std::vector<std::vector<float>> probe(s.batch);  // [batch] the probe's row from row 0 of m=1
    const std::vector<float> clean = pr.x(), clean_y0 = pr.y0();
    for (const Placement& at : placements) {
      std::vector<float>& x = pr.x();
      for (int b = 0; b < s.batch; ++b) {
        for (int r = 0; r < at.m; ++r) {
          const size_t row = pr.x_index(b, r), probe_row = pr.x_index(b, 0);
          for (int k = 0; k < s.k; ++k) {
            x[row + k] = r == at.position ? clean[probe_row + k]
                                          : hashed(9 + r, row + k, r % 2 ? 1e4f : 3.0f);
          }
        }
      }
      // The probe's accumulate input (y before the call) moves with it.
      std::vector<float>& y0 = pr.y0();
      for (int b = 0; b < s.batch; ++b) {
        std::memcpy(&y0[pr.y_index(b, at.position, 0)], &clean_y0[pr.y_index(b, 0, 0)],
                    size_t(s.n) * 4);
      }
      const std::vector<float> y = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, at.m);
      y0 = clean_y0;
      for (int b = 0; b < s.batch; ++b) {
        const auto first = y.begin() + ptrdiff_t(pr.y_index(b, at.position, 0));
        std::vector<float> row(first, first + s.n);
        if (probe[b].empty()) {
          probe[b] = row;
          pr.expect_row_matches_cpu(*cpu_, y, b, at.position, s.name + " probe" + label);
          continue;
        }
        EXPECT_EQ(std::memcmp(row.data(), probe[b].data(), row.size() * 4), 0)
            << s.name << ": the probe at position " << at.position << " of m=" << at.m << " (batch "
            << b << ") differs from the probe alone" << label;
      }
    }
  }
};

// Odd and even k and n, tails of every tile, unaligned rows, both layouts, batches, alpha and
// accumulate, at every tile config's m (<= 16, <= 64, larger) and across a split-K plan (k >=
// 1024 with few columns). Every row is checked against the CPU.
TEST_F(ParityGemm, RandomShapesWithinTheBound) {
  const std::vector<int> ms = {1, 2, 3, 5, 7, 8, 9, 17, 64, 65, 130};
  const std::vector<Shape> shapes = {
      {"tiny", 8, 16},
      {"odd", 37, 100, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 0.75f, 3, 1, 2},
      {"tails", 100, 37, 1, WeightLayout::kNK, GemmOutput::kAccumulate, -1.5f, 0, 5, 1},
      {"split", 72, 2500, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 0.5f, 0, 8, 0},
      {"split-odd", 130, 3001, 1, WeightLayout::kNK, GemmOutput::kAccumulate, 1.0f, 1, 3, 3},
      {"wide", 300, 520, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 1.0f, 0, 0, 0},
      {"kn", 96, 80, 3, WeightLayout::kKN, GemmOutput::kOverwrite, 0.75f, 4, 8, 2},
      {"kn-odd", 41, 23, 2, WeightLayout::kKN, GemmOutput::kAccumulate, 2.0f, 1, 1, 1},
      {"nk-batched", 96, 136, 3, WeightLayout::kNK, GemmOutput::kAccumulate, 0.75f, 0, 0, 2},
  };
  for (const Shape& s : shapes) check_shape(s, ms, true);
}

// Every projection of a V3.2 layer (the v32 preset: hidden 7168, q_lora 1536, 128 heads, 64
// index heads, intermediate 18432, vocab 32768), at the decode sizes. Row m-1 of each run is
// checked against the CPU; every row against the m = 256 run.
TEST_F(ParityGemm, V32ProjectionsWithinTheBound) {
  const std::vector<int> ms = {1, 2, 7, 8, 9, 64, 255, 256};
  const float w_scale = 1.0f / std::sqrt(64.0f * 128.0f);
  const std::vector<Shape> shapes = {
      {"x_proj (q_a | wk | kv_a | weights_proj)", 1536 + 128 + 576 + 64, 7168},
      {"q_b", 128 * 192, 1536},
      {"kv_b absorb (per head, kKN)", 512, 128, 128, WeightLayout::kKN},
      {"kv_b up (per head)", 128, 512, 128},
      {"o", 7168, 128 * 128, 1, WeightLayout::kNK, GemmOutput::kAccumulate},
      {"q_up (q_b | indexer wq_b)", 128 * 192 + 64 * 128, 1536},
      {"indexer weights_proj", 64, 7168, 1, WeightLayout::kNK, GemmOutput::kOverwrite, w_scale},
      {"mlp gate | up", 2 * 18432, 7168},
      {"mlp down", 7168, 18432, 1, WeightLayout::kNK, GemmOutput::kAccumulate},
      {"lm_head", 32768, 7168},
  };
  for (const Shape& s : shapes) check_shape(s, ms, false);
}

// The bf16 copy of x a norm writes (GemmParams::x_bf16) gives the bits of the in-backend
// conversion: the fusion never changes a result.
TEST_F(ParityGemm, GivenBf16CopyGivesTheSameBits) {
  for (const Shape& s : {Shape{"q_a", 1536, 7168}, Shape{"odd", 37, 100, 1, WeightLayout::kNK,
                                                         GemmOutput::kAccumulate, 0.5f, 3, 1, 2}}) {
    Problem pr(s, 8, 77);
    for (cuda::GemmKernel kernel : kKernels) {
      use(kernel);
      for (int m : {1, 8}) {
        const auto converted = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m, false);
        const auto given = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m, true);
        EXPECT_EQ(std::memcmp(converted.data(), given.data(), converted.size() * 4), 0)
            << s.name << " m=" << m << kernel_label(kernel);
      }
    }
  }
}

// The tile configuration and the way split partials are reduced never change a bit (the
// invariance arguments of gemm_invariant.cu, 2. and 3., and gemm_wgmma.cu, 3.): for each kernel,
// every tile, with each reduction forced (the reduce kernel, the fused one, the cluster one, the
// one through L2), gives the default's bytes, at m = 1, 70 and 130, for split shapes the copy
// engine reads (6 slices; 5 with a ragged last slice, a part feature tile and unaligned y rows:
// the cluster reduction runs on them), split shapes it cannot read (a ragged last slice,
// unaligned rows: the cp.async tiles, reduced through L2 whatever is asked), batched
// n-contiguous weights (the mma kernel under either) and a shape with one slice. The wgmma tiles
// run the rows in instructions of N = 8, 16, 32, 64 and 128: a row's bits do not depend on N.
TEST_F(ParityGemm, EveryTileAndReductionGiveTheSameBits) {
  const std::vector<Shape> shapes = {
      {"split-tma", 200, 3072, 1, WeightLayout::kNK, GemmOutput::kAccumulate, 0.5f, 0, 0, 0},
      {"split-tma-ragged", 136, 2624, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 1.0f, 0, 0, 2},
      {"split", 72, 2500, 1, WeightLayout::kNK, GemmOutput::kAccumulate, 0.5f, 0, 8, 0},
      {"split-odd", 130, 3001, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 1.0f, 1, 3, 3},
      {"kn batched", 96, 80, 3, WeightLayout::kKN, GemmOutput::kAccumulate, 1.0f, 4, 8, 2},
      {"one slice", 300, 520, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 0.75f, 0, 0, 0},
  };
  for (const Shape& s : shapes) {
    Problem pr(s, 130, 31 + uint64_t(s.n));
    for (cuda::GemmKernel kernel : kKernels) {
      for (int m : {1, 70, 130}) {
        use(kernel);
        if (s.name.rfind("split-tma", 0) == 0) {  // reduce 2 does run the cluster reduction
          cuda::GemmInvariantTuning tuning;
          tuning.kernel = kernel, tuning.reduce = 2;
          EXPECT_EQ(cuda::gemm_invariant_cluster_reduces(m, s.n, s.k, tuning),
                    kernel == cuda::GemmKernel::kWgmma)
              << s.name << " m=" << m << kernel_label(kernel);
        }
        const std::vector<float> want = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
        for (int tile = 0; tile < cuda::gemm_invariant_tile_count(kernel); ++tile) {
          for (int reduce : kReductions) {
            cuda::GemmInvariantTuning tuning;
            tuning.tile = tile, tuning.reduce = reduce, tuning.kernel = kernel;
            set_gemm_invariant_tuning(*cuda_, tuning);
            const std::vector<float> got = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
                << s.name << " m=" << m << kernel_label(kernel) << ": tile "
                << cuda::gemm_invariant_tile_name(tile, kernel) << reduction_label(reduce)
                << " differs from the default";
          }
        }
      }
    }
  }
}

// The wgmma kernel's pair tiles (.mc2: two CTAs of a cluster share each x tile by multicast
// copies) run paired, never the cp.async tile of their shape, and give the default's bits: an odd
// count of feature tiles (the last pair's second CTA past n), split K, unaligned rows, and rows
// that fill a 256-row tile's second half. Each reduction forced (the cluster and fused ones run
// the tile unpaired) gives the same bits too. (kKN weights on the pair tiles:
// KnWeightsOnWgmmaTiles, which runs every bulk-copy tile.)
TEST_F(ParityGemm, PairTilesRunPairedWithTheDefaultBits) {
  const std::vector<Shape> shapes = {
      {"odd feature tiles", 300, 1536, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 1.0f},
      {"split", 640, 7168, 1, WeightLayout::kNK, GemmOutput::kAccumulate, 0.5f},
      {"ragged", 200, 2624, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 1.0f, 0, 0, 2},
  };
  std::vector<int> pairs;
  for (int tile = 0; tile < cuda::gemm_invariant_tile_count(cuda::GemmKernel::kWgmma); ++tile) {
    if (cuda::gemm_invariant_tile_pair(tile, cuda::GemmKernel::kWgmma) == 2) pairs.push_back(tile);
  }
  ASSERT_EQ(pairs.size(), 3u) << "the .mc2 tiles";
  for (const Shape& s : shapes) {
    Problem pr(s, 256, 97 + uint64_t(s.n));
    for (int m : {1, 130, 256}) {
      use(cuda::GemmKernel::kWgmma);
      const std::vector<float> want = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
      for (int tile : pairs) {
        for (int reduce : kReductions) {
          cuda::GemmInvariantTuning tuning;
          tuning.tile = tile, tuning.reduce = reduce, tuning.kernel = cuda::GemmKernel::kWgmma;
          set_gemm_invariant_tuning(*cuda_, tuning);
          const uint64_t fallbacks = cuda::gemm_invariant_bulk_copy_fallbacks();
          const std::vector<float> got = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
          EXPECT_EQ(cuda::gemm_invariant_bulk_copy_fallbacks(), fallbacks)
              << s.name << " m=" << m << ": tile "
              << cuda::gemm_invariant_tile_name(tile, cuda::GemmKernel::kWgmma)
              << reduction_label(reduce) << " ran its cp.async tile";
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
              << s.name << " m=" << m << ": tile "
              << cuda::gemm_invariant_tile_name(tile, cuda::GemmKernel::kWgmma)
              << reduction_label(reduce) << " differs from the default";
        }
      }
      if (HasFailure()) return;
    }
  }
}

// The pair tiles once each on a small problem, for the sanitizers (scripts/gpu-pairs.sh):
// memcheck, racecheck and synccheck over the multicast copies, the remote arrivals and the
// cluster barriers.
TEST_F(ParityGemm, PairTilesSanitizerCompact) {
  const Shape s{"compact pairs", 300, 1024, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 1.0f};
  Problem pr(s, 130, 131);
  use(cuda::GemmKernel::kWgmma);
  const std::vector<float> want = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, 130);
  int ran = 0;
  for (int tile = 0; tile < cuda::gemm_invariant_tile_count(cuda::GemmKernel::kWgmma); ++tile) {
    if (cuda::gemm_invariant_tile_pair(tile, cuda::GemmKernel::kWgmma) != 2) continue;
    cuda::GemmInvariantTuning tuning;
    tuning.tile = tile, tuning.kernel = cuda::GemmKernel::kWgmma;
    set_gemm_invariant_tuning(*cuda_, tuning);
    const std::vector<float> got = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, 130);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
        << cuda::gemm_invariant_tile_name(tile, cuda::GemmKernel::kWgmma);
    ++ran;
  }
  EXPECT_EQ(ran, 3);
}

// The V3.2 projections that split K (x_proj 7 slices, kv_a 8, q_a 4, o 2) at the decode sizes:
// their slices summed in clusters (reduce 2; by default at m <= 16) give the bytes of the
// reduction through L2 (the fused one or the separate kernel, as the tile asks), with and without
// programmatic dependent launch.
TEST_F(ParityGemm, ClusterReductionGivesTheBitsOfTheReductionThroughL2) {
  const std::vector<Shape> shapes = {
      {"x_proj (q_a | wk | kv_a | weights_proj)", 1536 + 128 + 576 + 64, 7168},
      {"kv_a", 576, 7168, 1, WeightLayout::kNK, GemmOutput::kAccumulate, 0.5f},
      {"q_a", 1536, 7168},
      {"o", 7168, 128 * 128, 1, WeightLayout::kNK, GemmOutput::kAccumulate},
  };
  for (const Shape& s : shapes) {
    Problem pr(s, 256, 71 + uint64_t(s.n));
    for (int m : {1, 64, 256}) {
      cuda::GemmInvariantTuning tuning;
      tuning.kernel = cuda::GemmKernel::kWgmma;
      ASSERT_GE(cuda::gemm_invariant_splits(s.n, s.k, 1, tuning), 2) << s.name;
      EXPECT_EQ(cuda::gemm_invariant_cluster_reduces(m, s.n, s.k, tuning), m <= 16)
          << s.name << " m=" << m << ": the default's choice";
      tuning.reduce = 2;
      ASSERT_TRUE(cuda::gemm_invariant_cluster_reduces(m, s.n, s.k, tuning))
          << s.name << " m=" << m;
      set_gemm_invariant_tuning(*cuda_, tuning);
      const std::vector<float> cluster = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
      tuning.reduce = 3;
      EXPECT_FALSE(cuda::gemm_invariant_cluster_reduces(m, s.n, s.k, tuning));
      set_gemm_invariant_tuning(*cuda_, tuning);
      const std::vector<float> global = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
      EXPECT_EQ(std::memcmp(cluster.data(), global.data(), cluster.size() * 4), 0)
          << s.name << " m=" << m << ": the cluster reduction differs from the one through L2";
      pr.expect_row_matches_cpu(*cpu_, cluster, 0, m - 1, s.name + " m=" + std::to_string(m));
      // Launched with programmatic dependent launch (the cluster and the PDL attribute together),
      // the same bytes.
      const testing::RestoreEnv restore({"DSA_CUDA_PDL"});
      setenv("DSA_CUDA_PDL", "on", 1);
      tuning.reduce = 2;
      set_gemm_invariant_tuning(*cuda_, tuning);
      const std::vector<float> pdl = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, m);
      EXPECT_EQ(std::memcmp(pdl.data(), cluster.data(), pdl.size() * 4), 0)
          << s.name << " m=" << m << ": the cluster reduction under PDL differs";
    }
  }
}

// Constant weights (GemmParams::w_constant) under programmatic dependent launch: the bulk-copy
// kernels copy the first stages' weights before their wait, never x. A chain of two GEMMs, the
// second reading the first's output, queued back to back after that output was poisoned with NaN:
// the second sees the first's values (the same bytes as the chain without PDL and without the
// flag), at every row class, repeated, on the default tiles and a pair tile.
TEST_F(ParityGemm, ConstantWeightsUnderPdlSeeTheirProducersOutput) {
  constexpr int kMaxM = 256, kK1 = 1024, kN1 = 2048, kN2 = 1536;
  testing::Rng rng(211);
  std::vector<float> x1(size_t(kMaxM) * kK1);
  for (float& v : x1) v = rng.uniform(-1.0f, 1.0f);
  auto weights = [&](int n, int k) {
    std::vector<Bf16> w(size_t(n) * k);
    for (Bf16& v : w) v = float_to_bf16(rng.uniform(-0.05f, 0.05f));
    return w;
  };
  const std::vector<Bf16> w1 = weights(kN1, kK1), w2 = weights(kN2, kN1);
  Guarded dx1(*cuda_, x1.size() * 4), dw1(*cuda_, w1.size() * 2), dw2(*cuda_, w2.size() * 2);
  Guarded dy1(*cuda_, size_t(kMaxM) * kN1 * 4), dy2(*cuda_, size_t(kMaxM) * kN2 * 4);
  dx1.write(x1.data()), dw1.write(w1.data()), dw2.write(w2.data());
  const std::vector<float> nan(size_t(kMaxM) * kN1, std::nanf(""));
  auto chain = [&](int m, bool w_constant) {
    dy1.write(nan.data());
    GemmParams g1;
    g1.x = static_cast<const float*>(dx1.data());
    g1.w = static_cast<const Bf16*>(dw1.data());
    g1.y = static_cast<float*>(dy1.data());
    g1.m = m, g1.n = kN1, g1.k = kK1, g1.ld_x = kK1, g1.ld_w = kK1, g1.ld_y = kN1;
    g1.w_constant = w_constant;
    GemmParams g2 = g1;
    g2.x = g1.y;
    g2.w = static_cast<const Bf16*>(dw2.data());
    g2.y = static_cast<float*>(dy2.data());
    g2.n = kN2, g2.k = kN1, g2.ld_x = kN1, g2.ld_w = kN1, g2.ld_y = kN2;
    cuda_->set_gemm_mode(GemmMode::kBatchInvariant);
    cuda_->gemm(g1);
    cuda_->gemm(g2);
    cuda_->synchronize();
    const std::vector<uint8_t> bytes = dy2.read("y2");
    std::vector<float> y(size_t(m) * kN2);
    std::memcpy(y.data(), bytes.data(), y.size() * 4);
    return y;
  };
  int pair_tile = -1;
  for (int tile = 0; tile < cuda::gemm_invariant_tile_count(cuda::GemmKernel::kWgmma); ++tile) {
    if (cuda::gemm_invariant_tile_pair(tile, cuda::GemmKernel::kWgmma) == 2) pair_tile = tile;
  }
  for (int tile : {-1, pair_tile}) {
    cuda::GemmInvariantTuning tuning;
    tuning.kernel = cuda::GemmKernel::kWgmma, tuning.tile = tile;
    set_gemm_invariant_tuning(*cuda_, tuning);
    for (int m : {1, 64, 256}) {
      const std::vector<float> want = chain(m, false);
      ASSERT_TRUE(std::all_of(want.begin(), want.end(), [](float v) { return std::isfinite(v); }));
      const testing::RestoreEnv restore({"DSA_CUDA_PDL"});
      setenv("DSA_CUDA_PDL", "on", 1);
      for (int rep = 0; rep < 4; ++rep) {
        const std::vector<float> got = chain(m, true);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << "m=" << m << " tile "
            << cuda::gemm_invariant_tile_name(tile, cuda::GemmKernel::kWgmma) << " rep " << rep
            << ": the second GEMM did not see the first's output";
      }
    }
  }
  set_gemm_invariant_tuning(*cuda_, {});
}

// One probe row, alone, among 7 and among 255 rows of large garbage, at several positions and
// at every graph bucket of the runner: its output row is the same bits every time.
TEST_F(ParityGemm, ProbeRowIsBitwiseInvariantToItsBatch) {
  std::vector<Placement> placements = {{1, 0}, {7, 0}, {7, 3}, {7, 6}, {255, 0}, {255, 200}};
  for (int bucket : default_buckets()) placements.push_back({bucket, bucket - 1});
  const std::vector<Shape> shapes = {
      {"q_a", 1536, 7168},
      {"kv_a (split)", 576, 7168, 1, WeightLayout::kNK, GemmOutput::kAccumulate, 0.5f},
      {"odd", 37, 100, 1, WeightLayout::kNK, GemmOutput::kOverwrite, 0.75f, 3, 1, 2},
      {"kn batched", 96, 80, 3, WeightLayout::kKN, GemmOutput::kAccumulate, 1.0f, 4, 8, 2},
  };
  for (const Shape& s : shapes) {
    for (cuda::GemmKernel kernel : kKernels) {
      use(kernel);
      check_probe(s, placements, kernel_label(kernel));
    }
  }
}

// kKN weights on the wgmma kernel's bulk-copy tiles (opt-in: GemmInvariantTuning::kn = 1,
// DSA_CUDA_GEMM_KN=wgmma; the weights read MN-major), check_kn_wgmma: every row within the CPU's
// bound and equal to the largest run's, every tile with both reductions the default tile's bits,
// and the probe row invariant to its batch. Small shapes (sanitizer-sized): a batched one with
// padded rows, n off the 64-feature boxes with K cut inside a k16 block, a split plan.
TEST_F(ParityGemm, KnWeightsOnWgmmaTiles) {
  check_kn_wgmma(
      {"kn batched", 96, 80, 3, WeightLayout::kKN, GemmOutput::kAccumulate, 0.75f, 4, 8, 2});
  check_kn_wgmma(
      {"kn tail", 200, 104, 2, WeightLayout::kKN, GemmOutput::kAccumulate, 0.5f, 0, 0, 1});
  check_kn_wgmma(
      {"kn split", 136, 1096, 1, WeightLayout::kKN, GemmOutput::kOverwrite, 1.0f, 0, 8, 0});
}

// The same for V3.2's kv_b absorb (128 heads of 128 x 512).
TEST_F(ParityGemm, KnWeightsOnWgmmaTilesKvBAbsorb) {
  check_kn_wgmma({"kv_b absorb", 512, 128, 128, WeightLayout::kKN});
}

// DSA_CUDA_GEMM picks the kernel of a backend made after it is set: "mma" and "wgmma" give the
// bits of the forced kernels; any other value is refused with a message naming it.
TEST_F(ParityGemm, EnvironmentPicksTheKernel) {
  const testing::RestoreEnv restore({"DSA_CUDA_GEMM"});
  const Shape s{"split-odd", 130, 3001, 1, WeightLayout::kNK, GemmOutput::kAccumulate,
                1.0f,        1,   3,    3};
  Problem pr(s, 9, 5);
  for (cuda::GemmKernel kernel : kKernels) {
    use(kernel);
    const std::vector<float> forced = pr.run_cuda(*cuda_, GemmMode::kBatchInvariant, 9);
    setenv("DSA_CUDA_GEMM", cuda::gemm_kernel_name(kernel), 1);
    const std::unique_ptr<Backend> picked = make_cuda_backend(0);
    const std::vector<float> got = pr.run_cuda(*picked, GemmMode::kBatchInvariant, 9);
    EXPECT_EQ(std::memcmp(got.data(), forced.data(), got.size() * 4), 0) << kernel_label(kernel);
  }
  setenv("DSA_CUDA_GEMM", "tensor", 1);
  try {
    make_cuda_backend(0);
    ADD_FAILURE() << "DSA_CUDA_GEMM=tensor was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'tensor'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsa::parity
