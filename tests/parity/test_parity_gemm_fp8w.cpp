// Parity of fp8 weights with 128x128 block scales (GemmParams::w_fp8) on CUDA.
//
// The contract (ops.h): an fp8 weight's value is dequant_fp8_weight(byte, its block's scale), so
// every mode must give exactly the bits it gives on that dequantized bf16 matrix:
//   - kBatchInvariant: the mma.sync kernel reading fp8 (gemm_tensor.cu) against the same kernel
//     reading the dequantized bf16 matrix (the same split plan and reduction): bitwise, for the
//     V3.2 projection shapes at m = 1, 8, 64, 256 and for odd shapes (n, k off the 128 grid,
//     unaligned rows: the element-load path), both output modes, every tile and both reductions,
//     and with the wgmma kernel asked for (fp8 falls back to mma: the same bits again);
//   - the wgmma kernel's fp8 tiles (GemmInvariantTuning::fp8 = 1, gemm_wgmma_fp8.cu) against the
//     bf16 wgmma kernel on the dequantized matrix: bitwise, where gemm_invariant_fp8_runs_wgmma
//     says they run (every V3.2 shape; the odd shapes fall back to mma and its bits), every fp8
//     tile and both reductions;
//   - a probe row alone, among 7 and among 255 rows of garbage: the same bits every time;
//   - kExact: the CPU's bits on the fp8 weights (cpu/gemm.cpp), bitwise;
//   - kFast: refused with a message.
// Outputs are poisoned outside [m, n) and 256 guard bytes surround every buffer; both must come
// back byte for byte. Weight codes cover every e4m3 value but NaN, and the scales span 2^-20 ..
// 2^6, so the f32 product and its bf16 rounding are exercised everywhere.
//
// fp8 activations (x_fp8, the e4m3 kernel of gemm_w8a8.cu): the CPU's result within the e4m3
// tensor core's bound and a tight nmse, for the V3.2 shapes and edge shapes; every tile and both
// reductions the same bits; the probe row bitwise invariant to its batch; refusals by message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "common/expect_error.h"
#include "common/restore_env.h"
#include "common/test_util.h"
#include "dsa/backend.h"
#include "dsa/error.h"
#include "dsa/token_codec.h"
#include "parity/gemm_guarded.h"

namespace dsa::parity {
namespace {

struct Shape {
  std::string name;
  int n, k;
  GemmOutput output = GemmOutput::kOverwrite;
  int pad_w = 0;  // extra bytes per weight row (odd: the element-load path)
};

// One fp8 weight matrix, its dequantized bf16 twin (both on the device, guarded), and x / y0 for
// up to max_m rows.
class Problem {
 public:
  Problem(Backend& cuda, const Shape& s, int max_m, uint64_t seed)
      : s_(s), max_m_(max_m), ld_w_(s.k + s.pad_w), ld_scale_((s.k + 127) / 128 + 1) {
    const int64_t nb = (s.n + 127) / 128;
    std::vector<uint8_t> q(size_t(s.n) * ld_w_, uint8_t(0x7F));  // row padding: NaN codes
    std::vector<float> scales(size_t(nb * ld_scale_), testing::kPoison);
    for (int64_t i = 0; i < nb; ++i) {
      for (int64_t j = 0; j + 1 < ld_scale_; ++j) {
        const int e = int(hash_bits(seed + 5, uint64_t(i * ld_scale_ + j)) % 27) - 20;
        scales[size_t(i * ld_scale_ + j)] =
            std::ldexp(0.5f + 0.5f * std::fabs(hashed(seed + 6, uint64_t(i * ld_scale_ + j))), e);
      }
    }
    std::vector<Bf16> w(size_t(s.n) * s.k);
    for (int64_t r = 0; r < s.n; ++r) {
      for (int64_t c = 0; c < s.k; ++c) {
        uint8_t code = uint8_t(hash_bits(seed, uint64_t(r * s.k + c)));
        if ((code & 0x7F) == 0x7F) code ^= 1;  // NaN codes out
        q[size_t(r * ld_w_ + c)] = code;
        w[size_t(r * s.k + c)] =
            dequant_fp8_weight(Fp8E4M3{code}, scales[size_t(r / 128 * ld_scale_ + c / 128)]);
      }
    }
    q_dev_ = std::make_unique<Guarded>(cuda, q.size());
    q_dev_->write(q.data());
    s_dev_ = std::make_unique<Guarded>(cuda, scales.size() * 4);
    s_dev_->write(scales.data());
    w_dev_ = std::make_unique<Guarded>(cuda, w.size() * 2);
    w_dev_->write(w.data());
    q_host_ = std::move(q);
    scale_host_ = std::move(scales);
    x_.resize(size_t(max_m) * s.k);
    for (size_t i = 0; i < x_.size(); ++i) x_[i] = hashed(seed + 1, i, 2.0f);
    y0_.assign(size_t(max_m + 2) * s.n, testing::kPoison);
    if (s.output == GemmOutput::kAccumulate) {
      for (size_t i = 0; i < size_t(max_m) * s.n; ++i) y0_[i] = hashed(seed + 2, i, 3.0f);
    }
  }

  std::vector<float>& x() { return x_; }
  const Shape& shape() const { return s_; }

  GemmParams params(int m, bool fp8, bool x_fp8 = false) const {
    GemmParams p;
    p.x_fp8 = x_fp8;
    p.m = m, p.n = s_.n, p.k = s_.k;
    p.ld_x = s_.k, p.ld_y = s_.n;
    p.output = s_.output;
    p.alpha = s_.output == GemmOutput::kAccumulate ? 0.5f : 1.0f;
    if (fp8) {
      p.w_fp8 = static_cast<const uint8_t*>(q_dev_->data());
      p.w_scale = static_cast<const float*>(s_dev_->data());
      p.ld_w = ld_w_, p.ld_w_scale = ld_scale_;
    } else {
      p.w = static_cast<const Bf16*>(w_dev_->data());
      p.ld_w = s_.k;
    }
    return p;
  }

  // y after one run with m rows: fp8 or the dequantized bf16 weights. Adds failures for changed
  // guards or bytes outside the m x n output (rows m, m + 1 are poisoned past the output).
  std::vector<float> run(Backend& be, GemmMode mode, int m, bool fp8, bool x_fp8 = false) {
    Guarded x(be, x_.size() * 4), y(be, y0_.size() * 4);
    x.write(x_.data());
    y.write(y0_.data());
    GemmParams p = params(m, fp8, x_fp8);
    p.x = static_cast<const float*>(x.data());
    p.y = static_cast<float*>(y.data());
    be.set_gemm_mode(mode);
    be.gemm(p);
    be.synchronize();
    const std::string what = s_.name + (fp8 ? " fp8" : " bf16") + " m=" + std::to_string(m);
    x.read(what + " x"), q_dev_->read(what + " w_fp8"), s_dev_->read(what + " w_scale");
    w_dev_->read(what + " w");
    const std::vector<uint8_t> bytes = y.read(what + " y");
    std::vector<float> out(y0_.size());
    std::memcpy(out.data(), bytes.data(), bytes.size());
    size_t changed = 0;
    for (size_t i = size_t(m) * s_.n; i < out.size(); ++i) {
      changed += std::memcmp(&out[i], &y0_[i], 4) != 0;
    }
    EXPECT_EQ(changed, 0u) << what << ": floats past the m x n output changed";
    return out;
  }

  // The CPU backend on the same fp8 weights (host copies), m rows.
  std::vector<float> run_cpu(Backend& cpu, int m, bool x_fp8 = false) const {
    std::vector<float> y = y0_;
    GemmParams p = params(m, true, x_fp8);
    p.x = x_.data(), p.y = y.data();
    p.w_fp8 = q_host_.data(), p.w_scale = scale_host_.data();
    cpu.gemm(p);
    return y;
  }

  // A = |alpha| sum over blocks of |s_x s_w| sum over k of |q_x q_w| per output of m rows (the
  // codes and scales of x as encode_fp8_group makes them): the magnitude the e4m3 tensor core's
  // truncations are bounded by.
  std::vector<double> w8a8_magnitude(int m) const {
    const int blocks = (s_.k + 127) / 128;
    std::vector<double> qx(size_t(m) * s_.k), sx(size_t(m) * blocks);
    std::vector<Fp8E4M3> codes(128);
    for (int r = 0; r < m; ++r) {
      for (int b = 0; b < blocks; ++b) {
        const int k0 = 128 * b, len = std::min(128, s_.k - k0);
        sx[size_t(r * blocks + b)] = encode_fp8_group(x_.data() + size_t(r) * s_.k + k0, len,
                                                      codes.data(), ScaleRounding::kExact);
        for (int i = 0; i < len; ++i) {
          qx[size_t(r) * s_.k + k0 + i] = std::fabs(fp8_to_float(codes[size_t(i)]));
        }
      }
    }
    const double alpha = s_.output == GemmOutput::kAccumulate ? 0.5 : 1.0;
    std::vector<double> a(size_t(m) * s_.n);
    std::vector<double> qw(size_t(s_.k));
    for (int n = 0; n < s_.n; ++n) {
      for (int k = 0; k < s_.k; ++k) {
        qw[size_t(k)] = std::fabs(fp8_to_float(Fp8E4M3{q_host_[size_t(n * ld_w_ + k)]}));
      }
      for (int r = 0; r < m; ++r) {
        double total = 0;
        for (int b = 0; b < blocks; ++b) {
          double part = 0;
          for (int k = 128 * b; k < std::min(s_.k, 128 * b + 128); ++k) {
            part += qx[size_t(r) * s_.k + k] * qw[size_t(k)];
          }
          total += part * sx[size_t(r * blocks + b)] *
                   std::fabs(scale_host_[size_t(n / 128 * ld_scale_ + b)]);
        }
        a[size_t(r) * s_.n + n] = alpha * total;
      }
    }
    return a;
  }
  const std::vector<float>& y0() const { return y0_; }

 private:
  Shape s_;
  int max_m_;
  int64_t ld_w_, ld_scale_;
  std::vector<uint8_t> q_host_;
  std::vector<float> scale_host_, x_, y0_;
  std::unique_ptr<Guarded> q_dev_, s_dev_, w_dev_;
};

::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b,
                                     size_t from, size_t count, const std::string& what) {
  for (size_t i = from; i < from + count; ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      return ::testing::AssertionFailure()
             << what << ": element " << i - from << " is " << a[i] << ", expected " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class ParityGemmFp8w : public GemmParityTest {
 protected:
  // fp8: the fp8 kernel under wgmma (0 mma.sync, 1 the wgmma fp8 tiles); fp8_tile likewise.
  cuda::GemmInvariantTuning tune(int tile, int reduce, cuda::GemmKernel kernel, int fp8 = 0,
                                 int fp8_tile = -1) {
    cuda::GemmInvariantTuning t;
    t.tile = tile, t.reduce = reduce, t.kernel = kernel, t.fp8 = fp8, t.fp8_tile = fp8_tile;
    set_gemm_invariant_tuning(*cuda_, t);
    return t;
  }
  // fp8 against bf16 on the dequantized weights (mma kernel, default plan), every m of ms; fp8
  // again with the wgmma kernel asked for (mma's bits); and the wgmma fp8 tiles against the bf16
  // wgmma kernel where they run (expect_wgmma: the shape must be one of those).
  void check_wgmma_fp8(const Shape& s, const std::vector<int>& ms, bool every_tile);
  // The probe row (row 0 of the clean x) alone, among 7 and among 255 rows of garbage (every
  // other one 1e4 times larger), at several positions, under the tuning set: the same bits every
  // time. x_fp8: fp8 activations too.
  void check_probe_row(const std::vector<Shape>& shapes, bool x_fp8, const std::string& label) {
    struct Placement {
      int m, position;
    };
    const Placement placements[] = {{1, 0},   {8, 0},     {8, 3},    {8, 7},
                                    {256, 0}, {256, 100}, {256, 255}};
    for (const Shape& s : shapes) {
      Problem pr(*cuda_, s, 256, 4242);
      const std::vector<float> clean = pr.x();
      std::vector<float> probe;
      for (const Placement& at : placements) {
        std::vector<float>& x = pr.x();
        for (int r = 0; r < at.m; ++r) {
          for (int k = 0; k < s.k; ++k) {
            const size_t i = size_t(r) * s.k + k;
            x[i] = r == at.position ? clean[k] : hashed(9 + r, i, r % 2 ? 1e4f : 3.0f);
          }
        }
        const std::vector<float> y = pr.run(*cuda_, GemmMode::kBatchInvariant, at.m, true, x_fp8);
        const std::vector<float> row(y.begin() + size_t(at.position) * s.n,
                                     y.begin() + size_t(at.position + 1) * s.n);
        if (probe.empty()) {
          probe = row;
          continue;
        }
        ASSERT_TRUE(same_bits(row, probe, 0, size_t(s.n),
                              s.name + label + " probe at " + std::to_string(at.position) + " of " +
                                  std::to_string(at.m)));
      }
    }
  }
  void check_shape(const Shape& s, const std::vector<int>& ms, bool expect_wgmma) {
    Problem pr(*cuda_, s, ms.back(), 77 + uint64_t(s.n) * 3 + uint64_t(s.k));
    for (int m : ms) {
      tune(-1, -1, cuda::GemmKernel::kMma);
      const std::vector<float> want = pr.run(*cuda_, GemmMode::kBatchInvariant, m, false);
      const std::vector<float> got = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true);
      const std::string what = s.name + " m=" + std::to_string(m);
      ASSERT_TRUE(same_bits(got, want, 0, size_t(m) * s.n, what + " [mma]"));
      tune(-1, -1, cuda::GemmKernel::kWgmma);
      const std::vector<float> fallback = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true);
      ASSERT_TRUE(same_bits(fallback, want, 0, size_t(m) * s.n, what + " [wgmma asked]"));

      const cuda::GemmInvariantTuning t = tune(-1, -1, cuda::GemmKernel::kWgmma, 1);
      const bool on_wgmma = cuda::gemm_invariant_fp8_runs_wgmma(pr.params(m, true), t);
      ASSERT_EQ(on_wgmma, expect_wgmma) << what;
      const std::vector<float> want_wg =
          on_wgmma ? pr.run(*cuda_, GemmMode::kBatchInvariant, m, false) : want;
      const std::vector<float> got_wg = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true);
      ASSERT_TRUE(same_bits(got_wg, want_wg, 0, size_t(m) * s.n, what + " [wgmma fp8 tiles]"));
    }
  }
};

// The wgmma fp8 tiles on s at each m of ms against the bf16 wgmma kernel on the dequantized
// matrix, bitwise: the default tile and reduction, or every fp8 tile with both reductions.
void ParityGemmFp8w::check_wgmma_fp8(const Shape& s, const std::vector<int>& ms, bool every_tile) {
  Problem pr(*cuda_, s, ms.back(), 19 + uint64_t(s.n) + uint64_t(s.k));
  const int tiles = every_tile ? cuda::gemm_invariant_fp8_tile_count() : 1;
  for (int m : ms) {
    tune(-1, -1, cuda::GemmKernel::kWgmma);
    const std::vector<float> want = pr.run(*cuda_, GemmMode::kBatchInvariant, m, false);
    for (int tile = 0; tile < tiles; ++tile) {
      for (int reduce : every_tile ? std::vector<int>{0, 1} : std::vector<int>{-1}) {
        const cuda::GemmInvariantTuning t =
            tune(-1, reduce, cuda::GemmKernel::kWgmma, 1, every_tile ? tile : -1);
        ASSERT_TRUE(cuda::gemm_invariant_fp8_runs_wgmma(pr.params(m, true), t)) << s.name;
        const std::vector<float> got = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true);
        ASSERT_TRUE(same_bits(
            got, want, 0, size_t(m) * s.n,
            s.name + " m=" + std::to_string(m) + " fp8 tile " +
                cuda::gemm_invariant_fp8_tile_name(cuda::gemm_invariant_fp8_tile(m, s.n, s.k, t)) +
                " reduce " + std::to_string(reduce)));
      }
    }
  }
}

TEST_F(ParityGemmFp8w, V32ProjectionsMatchBf16Bits) {
  const std::vector<Shape> shapes = {
      {"x_proj (q_a | wk | kv_a)", 1536 + 128 + 576, 7168},
      {"q_b", 128 * 192, 1536},
      {"o", 7168, 128 * 128, GemmOutput::kAccumulate},
      {"q_up (q_b | wq_b)", 128 * 192 + 64 * 128, 1536},
      {"gate | up", 2 * 18432, 7168},
      {"down", 7168, 18432, GemmOutput::kAccumulate},
  };
  for (const Shape& s : shapes) check_shape(s, {1, 8, 64, 256}, true);
}

TEST_F(ParityGemmFp8w, OddShapesMatchBf16Bits) {
  const std::vector<Shape> shapes = {
      {"n1k1", 1, 1},
      {"n130k300", 130, 300, GemmOutput::kOverwrite, 3},
      {"n257k129", 257, 129, GemmOutput::kAccumulate, 1},
      {"n300k1000", 300, 1000, GemmOutput::kOverwrite, 16},
      {"n72k2050", 72, 2050, GemmOutput::kAccumulate, 5},
  };
  for (const Shape& s : shapes) check_shape(s, {1, 7, 64, 100}, false);
}

// Every mma tile and both split reductions: the same bits as the bf16 default, aligned rows (the
// cp.async path) and unaligned ones (element loads).
TEST_F(ParityGemmFp8w, EveryTileAndReductionGiveTheSameBits) {
  const std::vector<Shape> shapes = {{"kv_a", 576, 7168}, {"n200k1500", 200, 1500, {}, 3}};
  for (const Shape& s : shapes) {
    Problem pr(*cuda_, s, 64, 9);
    for (int m : {1, 64}) {
      tune(-1, -1, cuda::GemmKernel::kMma);
      const std::vector<float> want = pr.run(*cuda_, GemmMode::kBatchInvariant, m, false);
      for (int tile = 0; tile < cuda::gemm_invariant_tile_count(cuda::GemmKernel::kMma); ++tile) {
        for (int reduce : {0, 1}) {
          tune(tile, reduce, cuda::GemmKernel::kMma);
          const std::vector<float> got = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true);
          ASSERT_TRUE(same_bits(got, want, 0, size_t(m) * s.n,
                                s.name + " m=" + std::to_string(m) + " tile " +
                                    cuda::gemm_invariant_tile_name(tile) + " reduce " +
                                    std::to_string(reduce)));
        }
      }
    }
  }
}

// Every wgmma fp8 tile and both split reductions: the bits of the bf16 wgmma kernel on the
// dequantized matrix (kv_a: 8 slices; o: 2 slices and accumulate; q_b: one slice).
TEST_F(ParityGemmFp8w, EveryWgmmaFp8TileAndReductionGiveTheWgmmaBits) {
  check_wgmma_fp8({"kv_a", 576, 7168}, {1, 64}, true);
  check_wgmma_fp8({"o", 7168, 128 * 128, GemmOutput::kAccumulate}, {1, 64}, true);
  check_wgmma_fp8({"q_b", 128 * 192, 1536}, {1, 64}, true);
}

// The wgmma fp8 tiles at the edges: n off the 128 grid (rows past n, their scale block absent),
// K a multiple of 8 but not of 64 or 16 (a last stage cut inside a k16 block), accumulate, rows
// past the tile; every fp8 tile with both reductions, so the tiles the default never picks (fp8r)
// run under scripts/gpu-fp8w.sh's sanitizers too. Small enough for them.
TEST_F(ParityGemmFp8w, WgmmaFp8EdgeShapesGiveTheWgmmaBits) {
  check_wgmma_fp8({"n200k1000", 200, 1000, GemmOutput::kOverwrite, 8}, {1, 9, 70}, true);
  check_wgmma_fp8({"n136k520", 136, 520, GemmOutput::kAccumulate, 8}, {1, 9, 70}, true);
}

// The probe row (row 0 of the clean x) alone, among 7 and among 255 rows of garbage, at several
// positions: the same bits every time, on mma.sync and on the wgmma fp8 tiles.
TEST_F(ParityGemmFp8w, ProbeRowIsBitwiseInvariantToItsBatch) {
  for (int fp8 : {0, 1}) {
    tune(-1, -1, cuda::GemmKernel::kWgmma, fp8);
    check_probe_row({{"q_a", 1536, 7168}, {"o", 7168, 128 * 128}, {"n130k300", 130, 300, {}, 3}},
                    false, " fp8 kernel " + std::to_string(fp8));
  }
}

// kExact reads fp8 weights as the CPU does: the CPU's bits, small-m and large-m kernels.
TEST_F(ParityGemmFp8w, ExactModeMatchesTheCpuBits) {
  const std::vector<Shape> shapes = {{"kv_a", 576, 7168}, {"n130k300", 130, 300, {}, 3}};
  for (const Shape& s : shapes) {
    Problem pr(*cuda_, s, 40, 31);
    for (int m : {1, 40}) {
      const std::vector<float> got = pr.run(*cuda_, GemmMode::kExact, m, true);
      const std::vector<float> want = pr.run_cpu(*cpu_, m);
      ASSERT_TRUE(
          same_bits(got, want, 0, size_t(m) * s.n, s.name + " exact m=" + std::to_string(m)));
    }
  }
}

// DSA_CUDA_GEMM_FP8 picks the fp8 kernel of a backend made after it is set: "mma" and "wgmma" give
// the bits of the tuning that forces each; another value is refused with a message naming it.
// DSA_CUDA_GEMM_FP8_TILE names one wgmma fp8 tile for every call (the same bits, as every tile
// gives); a name that is no tile is refused, naming it and listing the tiles.
TEST_F(ParityGemmFp8w, EnvironmentPicksTheFp8Kernel) {
  const testing::RestoreEnv restore(
      {"DSA_CUDA_GEMM", "DSA_CUDA_GEMM_FP8", "DSA_CUDA_GEMM_FP8_TILE"});
  setenv("DSA_CUDA_GEMM", "wgmma", 1);
  unsetenv("DSA_CUDA_GEMM_FP8_TILE");
  Problem pr(*cuda_, {"n256k1024", 256, 1024}, 9, 41);
  std::vector<float> wgmma_bits;
  for (int fp8 : {0, 1}) {
    tune(-1, -1, cuda::GemmKernel::kWgmma, fp8);
    const std::vector<float> forced = pr.run(*cuda_, GemmMode::kBatchInvariant, 9, true);
    setenv("DSA_CUDA_GEMM_FP8", fp8 ? "wgmma" : "mma", 1);
    const std::unique_ptr<Backend> picked = make_cuda_backend(0);
    const std::vector<float> got = pr.run(*picked, GemmMode::kBatchInvariant, 9, true);
    EXPECT_EQ(std::memcmp(got.data(), forced.data(), got.size() * 4), 0) << "fp8 kernel " << fp8;
    if (fp8) wgmma_bits = forced;
  }
  for (int tile = 0; tile < cuda::gemm_invariant_fp8_tile_count(); ++tile) {
    setenv("DSA_CUDA_GEMM_FP8_TILE", cuda::gemm_invariant_fp8_tile_name(tile), 1);
    const std::unique_ptr<Backend> picked = make_cuda_backend(0);
    const std::vector<float> got = pr.run(*picked, GemmMode::kBatchInvariant, 9, true);
    EXPECT_EQ(std::memcmp(got.data(), wgmma_bits.data(), got.size() * 4), 0)
        << "DSA_CUDA_GEMM_FP8_TILE=" << cuda::gemm_invariant_fp8_tile_name(tile);
  }
  setenv("DSA_CUDA_GEMM_FP8_TILE", "fp8.9x9", 1);
  testing::expect_error([&] { make_cuda_backend(0); }, ErrorCode::kInvalidArgument,
                        {"DSA_CUDA_GEMM_FP8_TILE", "'fp8.9x9'", "fp8r.8x128.s6"});
  unsetenv("DSA_CUDA_GEMM_FP8_TILE");
  setenv("DSA_CUDA_GEMM_FP8", "fp8", 1);
  testing::expect_error([&] { make_cuda_backend(0); }, ErrorCode::kInvalidArgument,
                        {"DSA_CUDA_GEMM_FP8", "'fp8'"});
}

// ---- fp8 activations (GemmParams::x_fp8, gemm_w8a8.cu) -----------------------------------------
//
// Against the CPU (cpu/gemm.cpp, ops.h's definition). The products of e4m3 codes are exact, but
// the e4m3 tensor core adds an instruction's 32 products aligned to the largest and truncated to
// 13 bits, and its accumulator the same way, so a block product is off by less than about
// 4 x 33 x 2^-12 of the block's sum of |products|: |cuda - cpu| <= 2^-5 A + 2^-20 (|y| + |y0|)
// per element (A: Problem::w8a8_magnitude), a worst case that holds for any data. The test that
// tells a right kernel from a wrong one is the nmse over the output, at most kW8a8Nmse (a wrong
// scale, row or layout gives 1 or more; the truncations, far less).
constexpr double kW8a8Nmse = 1e-4;

// cuda against the CPU over the m x n output: per element within the bound, and the nmse. Returns
// the nmse (printed by the callers, for the results file).
double expect_w8a8_near(const std::vector<float>& got, const std::vector<float>& want,
                        const std::vector<double>& a, const std::vector<float>& y0, int m, int n,
                        const std::string& what) {
  double err = 0, ref = 0;
  size_t bad = 0;
  for (size_t i = 0; i < size_t(m) * n; ++i) {
    const double d = double(got[i]) - want[i];
    // y0: the accumulated-into output (poison where the output is overwritten: not read).
    const double before = std::isfinite(y0[i]) ? std::fabs(y0[i]) : 0.0;
    const double bound = 0x1p-5 * a[i] + 0x1p-20 * (std::fabs(want[i]) + before);
    if (!(std::fabs(d) <= bound)) {
      if (bad++ < 3) {
        ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", the CPU's " << want[i]
                      << ", bound " << bound;
      }
    }
    err += d * d;
    ref += double(want[i]) * want[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": elements outside the bound";
  const double nmse = ref > 0 ? err / ref : err;
  EXPECT_LE(nmse, kW8a8Nmse) << what;
  return nmse;
}

class ParityGemmW8a8 : public ParityGemmFp8w {
 protected:
  cuda::GemmInvariantTuning tune_w8a8(int tile, int reduce) {
    cuda::GemmInvariantTuning t;
    t.w8a8_tile = tile, t.reduce = reduce;
    set_gemm_invariant_tuning(*cuda_, t);
    return t;
  }
  void check_cpu(const Shape& s, const std::vector<int>& ms) {
    Problem pr(*cuda_, s, ms.back(), 300 + uint64_t(s.n) + uint64_t(s.k));
    for (int m : ms) {
      tune_w8a8(-1, -1);
      ASSERT_TRUE(cuda::gemm_invariant_w8a8_runs(pr.params(m, true, true))) << s.name;
      const std::vector<float> got = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true, true);
      const std::vector<float> want = pr.run_cpu(*cpu_, m, true);
      const std::string what = s.name + " m=" + std::to_string(m);
      const double nmse = expect_w8a8_near(got, want, pr.w8a8_magnitude(m), pr.y0(), m, s.n, what);
      std::printf("w8a8 %s: nmse %.3g against the CPU\n", what.c_str(), nmse);
    }
  }
  // Every tile and both reductions at each m: the bits of the default (a tile never changes a
  // bit).
  void check_tiles(const Shape& s, const std::vector<int>& ms) {
    Problem pr(*cuda_, s, ms.back(), 500 + uint64_t(s.n));
    for (int m : ms) {
      tune_w8a8(-1, -1);
      const std::vector<float> want = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true, true);
      for (int tile = 0; tile < cuda::gemm_invariant_w8a8_tile_count(); ++tile) {
        for (int reduce : {0, 1, 2, 3}) {  // kernel, fused, cluster, through L2
          tune_w8a8(tile, reduce);
          const std::vector<float> got = pr.run(*cuda_, GemmMode::kBatchInvariant, m, true, true);
          ASSERT_TRUE(same_bits(got, want, 0, size_t(m) * s.n,
                                s.name + " m=" + std::to_string(m) + " tile " +
                                    cuda::gemm_invariant_w8a8_tile_name(tile) + " reduce " +
                                    std::to_string(reduce)));
        }
      }
    }
  }
};

TEST_F(ParityGemmW8a8, V32ProjectionsMatchTheCpuWithinTheBound) {
  check_cpu({"x_proj (q_a | wk | kv_a)", 1536 + 128 + 576, 7168}, {1, 5});
  check_cpu({"q_up (q_b | wq_b)", 128 * 192 + 64 * 128, 1536}, {1, 5});
  check_cpu({"o", 7168, 128 * 128, GemmOutput::kAccumulate}, {1, 5});
  check_cpu({"gate | up", 2 * 18432, 7168}, {1, 3});
  check_cpu({"down", 7168, 18432, GemmOutput::kAccumulate}, {1, 3});
}

// n off the 128 grid (a last scale block of 72 rows; whole warpgroups past n), K a multiple of 16
// but not of 128 (a short last block), padded weight rows, accumulate, m past a tile's rows.
TEST_F(ParityGemmW8a8, EdgeShapesMatchTheCpuWithinTheBound) {
  check_cpu({"n200k1008", 200, 1008, GemmOutput::kOverwrite, 16}, {1, 9, 70});
  check_cpu({"n72k2064", 72, 2064, GemmOutput::kAccumulate}, {1, 9, 70});
  check_cpu({"n1k16", 1, 16}, {1, 9});
  check_cpu({"q_a", 1536, 7168}, {64, 200});
}

TEST_F(ParityGemmW8a8, EveryTileAndReductionGiveTheSameBits) {
  // The default reduces these split shapes in clusters at m = 1, and reduce 2 at every m (the
  // bits under test below).
  cuda::GemmInvariantTuning forced;
  forced.reduce = 2;
  for (const auto& [n, k] : {std::pair{576, 7168}, {7168, 128 * 128}, {1536 + 128 + 576, 7168}}) {
    EXPECT_TRUE(cuda::gemm_invariant_w8a8_cluster_reduces(1, n, k, cuda::GemmInvariantTuning{}))
        << n << " x " << k;
    EXPECT_TRUE(cuda::gemm_invariant_w8a8_cluster_reduces(256, n, k, forced)) << n << " x " << k;
  }
  check_tiles({"kv_a", 576, 7168}, {1, 64});                                    // 8 slices
  check_tiles({"o", 7168, 128 * 128, GemmOutput::kAccumulate}, {1, 40});        // 2 slices
  check_tiles({"x_proj (q_a | wk | kv_a)", 1536 + 128 + 576, 7168}, {1, 256});  // 7 slices
  check_tiles({"n200k1008", 200, 1008, GemmOutput::kOverwrite, 16}, {1, 9, 70});
}

// Small enough for compute-sanitizer (scripts/gpu-w8a8.sh): every tile, every reduction, one
// slice and four (n136k2048: split_plan's formula; by default the cluster reduction), rows past a
// tile.
TEST_F(ParityGemmW8a8, SanitizerCompact) {
  check_tiles({"n200k1008", 200, 1008, GemmOutput::kOverwrite, 16}, {1, 9, 70});
  check_tiles({"n136k2048", 136, 2048, GemmOutput::kAccumulate}, {1, 20});
  check_cpu({"n136k2048", 136, 2048, GemmOutput::kAccumulate}, {20});
}

// The probe row among garbage rows (some 1e4 times larger: its own scales must not see them).
TEST_F(ParityGemmW8a8, ProbeRowIsBitwiseInvariantToItsBatch) {
  tune_w8a8(-1, -1);
  check_probe_row({{"q_a", 1536, 7168}, {"o", 7168, 128 * 128}, {"n200k1008", 200, 1008, {}, 16}},
                  true, " w8a8");
}

TEST_F(ParityGemmW8a8, RefusesWhatItCannotRun) {
  Problem odd(*cuda_, {"n64k1000", 64, 1000}, 4, 6);
  testing::expect_error([&] { odd.run(*cuda_, GemmMode::kBatchInvariant, 4, true, true); },
                        ErrorCode::kInvalidArgument, {"w8a8", "multiples of 16"});
  Problem pr(*cuda_, {"n64k1024", 64, 1024}, 4, 7);
  testing::expect_error([&] { pr.run(*cuda_, GemmMode::kExact, 4, true, true); },
                        ErrorCode::kInvalidArgument, {"w8a8", "--gemm invariant"});
  testing::expect_error([&] { pr.run(*cuda_, GemmMode::kFast, 4, true, true); },
                        ErrorCode::kInvalidArgument, {"fp8 weights"});
}

TEST_F(ParityGemmFp8w, FastModeRefusesFp8Weights) {
  Problem pr(*cuda_, {"small", 64, 256}, 4, 5);
  testing::expect_error([&] { pr.run(*cuda_, GemmMode::kFast, 4, true); },
                        ErrorCode::kInvalidArgument, {"fp8 weights", "--gemm invariant"});
}

}  // namespace
}  // namespace dsa::parity
