// Parity of the small ops (norms, RoPE and RoPE + copy, Hadamard, GEMM, SwiGLU, softmax, embed,
// add) between the CPU reference and CUDA, and their batch invariance on CUDA: rows 1, 7, 64 and
// 256 of the same inputs must give the same bits for the rows they share.
//
// Expected agreement (see each .cu file for why):
//   exact:  rope, hadamard, embed, add, gemm in kExact mode (the same f32 sequence)
//   nmse:   rmsnorm, layernorm, softmax (reduction order), swiglu (expf), gemm kFast (bf16 x)
// The batch-invariant tensor-core gemm (bf16 x, a derived bound) is in test_parity_gemm.cpp.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

constexpr double kReductionNmse = 1e-10;  // f32 sums in another order
constexpr double kBf16Nmse = 1e-4;        // x rounded to bf16 (<= 2^-8 relative per element)
constexpr int kInvarianceRows[] = {1, 7, 64, 256};

std::string rows_vars(int rows, const std::string& rest) {
  return "rows=" + std::to_string(rows) + "," + rest;
}

// ---- norms ----

// pad: x's row stride is dim + pad (a multiple of 4 when dim and pad are: the 16-byte path).
// in_place: y is x (the statistics must be read before any column is written).
class NormCase final : public OpCase {
 public:
  NormCase(bool layer, int rows, int dim, bool bias, int pad = 5, bool in_place = false)
      : layer_(layer), rows_(rows), dim_(dim), bias_(bias), pad_(pad), in_place_(in_place) {}
  std::string name() const override { return layer_ ? "layernorm" : "rmsnorm"; }
  std::string vars() const override {
    return rows_vars(rows_, "dim=" + std::to_string(dim_) + (bias_ ? ",bias" : "") +
                                ",pad=" + std::to_string(pad_) + (in_place_ ? ",in_place" : ""));
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    w_ = ws.input(rng.bf16s(dim_));
    b_ = ws.input(rng.bf16s(dim_, 0.5f));
    ld_ = dim_ + pad_;
    std::vector<float> x(size_t(rows_) * ld_);
    for (int r = 0; r < rows_; ++r) {
      const float mean = rng.uniform(-3, 3);  // LayerNorm must not cancel a large mean badly
      for (int i = 0; i < ld_; ++i) x[r * ld_ + i] = mean + rng.normal(2.0f);
    }
    const Check check = Check::nmse(kReductionNmse).per_row(in_place_ ? ld_ : dim_);
    if (in_place_) {
      x_ = ws.inout(x, check, RowLayout::kRowMajor);
      y_ = x_;
    } else {
      x_ = ws.input(x);
      y_ = ws.output<float>(size_t(rows_) * dim_, check);
    }
  }
  void run(Workspace& ws, Side side) override {
    const int64_t ld_y = in_place_ ? ld_ : dim_;
    if (layer_) {
      LayerNormParams p{ws.ptr(x_, side),
                        ws.ptr(y_, side),
                        ws.ptr(w_, side),
                        bias_ ? ws.ptr(b_, side) : nullptr,
                        rows_,
                        dim_,
                        ld_,
                        ld_y,
                        1e-5f};
      ws.backend(side).layernorm(p);
    } else {
      RmsNormParams p{ws.ptr(x_, side),
                      ws.ptr(y_, side),
                      ws.ptr(w_, side),
                      rows_,
                      dim_,
                      ld_,
                      ld_y,
                      1e-6f,
                      nullptr,
                      0};
      ws.backend(side).rmsnorm(p);
    }
  }

 private:
  bool layer_;
  int rows_, dim_;
  bool bias_;
  int pad_;
  bool in_place_;
  int64_t ld_ = 0;
  Buf<Bf16> w_, b_;
  Buf<float> x_, y_;
};

// ---- RoPE ----

class RopeCase final : public OpCase {
 public:
  // copy: the fused rope + copy_rows (RopeParams::out), into rows of heads_ * kOutHead floats.
  RopeCase(RopeStyle style, int rows, int heads, int offset, bool copy = false)
      : style_(style), rows_(rows), heads_(heads), offset_(offset), copy_(copy) {}
  std::string name() const override { return copy_ ? "rope_copy" : "rope"; }
  std::string vars() const override {
    return rows_vars(rows_,
                     std::string(style_ == RopeStyle::kInterleaved ? "interleaved" : "half_split") +
                         ",heads=" + std::to_string(heads_) + ",offset=" + std::to_string(offset_));
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    table_ = ws.input(rope_test_table(kMaxPosition, kRopeDim));
    ld_head_ = offset_ + kRopeDim + 3;
    std::vector<int32_t> positions(rows_);
    std::vector<float> x(size_t(rows_) * heads_ * ld_head_);
    const size_t row_elems = size_t(heads_) * ld_head_;
    for (int r = 0; r < rows_; ++r) {  // row by row, so row prefixes match across sizes
      positions[r] = int32_t(rng.integer(-2, kMaxPosition + 2));  // some out of range
      for (size_t i = 0; i < row_elems; ++i) x[r * row_elems + i] = rng.normal();
    }
    positions_ = ws.input(positions);
    x_ = ws.inout(x, Check::exact(), RowLayout::kRowMajor);
    // Poisoned; the gaps between heads' copies must stay poison on both sides.
    if (copy_) out_ = ws.output<float>(size_t(rows_) * heads_ * kOutHead, Check::exact());
  }
  void run(Workspace& ws, Side side) override {
    RopeParams p{ws.ptr(x_, side),
                 ws.ptr(positions_, side),
                 ws.ptr(table_, side),
                 rows_,
                 heads_,
                 heads_ * ld_head_,
                 ld_head_,
                 offset_,
                 kRopeDim,
                 kMaxPosition,
                 style_};
    if (copy_) {
      p.out = ws.ptr(out_, side) + kOutOffset;
      p.ld_out_row = int64_t(heads_) * kOutHead;
      p.ld_out_head = kOutHead;
    }
    ws.backend(side).rope(p);
  }

 private:
  static constexpr int kMaxPosition = 300;
  static constexpr int kOutHead = kRopeDim + 13, kOutOffset = 5;  // copies land mid-row
  RopeStyle style_;
  int rows_, heads_, offset_;
  bool copy_;
  Buf<float> out_;
  int64_t ld_head_ = 0;
  Buf<float> table_, x_;
  Buf<int32_t> positions_;
};

// ---- Hadamard ----

class HadamardCase final : public OpCase {
 public:
  // pad: the row stride is dim + pad (pad 4 keeps rows 16-byte aligned, 3 does not).
  HadamardCase(int rows, int dim, int pad = 4) : rows_(rows), dim_(dim), pad_(pad) {}
  std::string name() const override { return "hadamard"; }
  std::string vars() const override {
    return rows_vars(rows_, "dim=" + std::to_string(dim_) + ",pad=" + std::to_string(pad_));
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    x_ = ws.inout(rng.normals(size_t(rows_) * (dim_ + pad_)), Check::exact(), RowLayout::kRowMajor);
  }
  void run(Workspace& ws, Side side) override {
    HadamardParams p{ws.ptr(x_, side), rows_, dim_, dim_ + pad_, 1.0f / std::sqrt(float(dim_))};
    ws.backend(side).hadamard(p);
  }

 private:
  int rows_, dim_, pad_;
  Buf<float> x_;
};

// ---- GEMM ----

struct GemmSpec {
  int m, n, k, batch;
  WeightLayout layout;
  GemmOutput output;
  GemmMode mode;
};

class GemmCase final : public OpCase {
 public:
  explicit GemmCase(GemmSpec s) : s_(s) {}
  std::string name() const override {
    return s_.mode == GemmMode::kExact ? "gemm/exact" : "gemm/fast";
  }
  std::string vars() const override {
    return "m=" + std::to_string(s_.m) + ",n=" + std::to_string(s_.n) +
           ",k=" + std::to_string(s_.k) + ",batch=" + std::to_string(s_.batch) +
           (s_.layout == WeightLayout::kNK ? ",nk" : ",kn") +
           (s_.output == GemmOutput::kAccumulate ? ",accumulate" : "");
  }
  // Batch entries are laid out [m, ...] per entry with the batch OUTERMOST except when batch is
  // 1, so kRowMajor prefix comparison is only meaningful (and only used) at batch 1.
  void init(Workspace& ws, testing::Rng& rng) override {
    ld_w_ = (s_.layout == WeightLayout::kNK ? s_.k : s_.n) + 8;
    const int64_t w_rows = s_.layout == WeightLayout::kNK ? s_.n : s_.k;
    w_ = ws.input(rng.bf16s(size_t(s_.batch) * w_rows * ld_w_, 0.2f));
    ld_x_ = s_.k + 4;
    ld_y_ = s_.n + 2;
    std::vector<float> x(size_t(s_.batch) * s_.m * ld_x_), y(size_t(s_.batch) * s_.m * ld_y_);
    for (size_t r = 0; r < size_t(s_.batch) * s_.m; ++r) {  // row by row: prefixes match
      for (int64_t i = 0; i < ld_x_; ++i) x[r * ld_x_ + i] = rng.normal();
      for (int64_t i = 0; i < ld_y_; ++i) y[r * ld_y_ + i] = rng.normal();
    }
    x_ = ws.input(x);
    const RowLayout rows = s_.batch == 1 ? RowLayout::kRowMajor : RowLayout::kWhole;
    const Check check = s_.mode == GemmMode::kExact ? Check::exact() : Check::nmse(kBf16Nmse);
    y_ = ws.inout(y, check, rows);
  }
  void run(Workspace& ws, Side side) override {
    GemmParams p;
    p.x = ws.ptr(x_, side);
    p.w = ws.ptr(w_, side);
    p.y = ws.ptr(y_, side);
    p.m = s_.m, p.n = s_.n, p.k = s_.k, p.batch = s_.batch;
    p.ld_x = ld_x_, p.ld_w = ld_w_, p.ld_y = ld_y_;
    p.batch_stride_x = int64_t(s_.m) * ld_x_;
    p.batch_stride_w = (s_.layout == WeightLayout::kNK ? s_.n : s_.k) * ld_w_;
    p.batch_stride_y = int64_t(s_.m) * ld_y_;
    p.layout = s_.layout;
    p.output = s_.output;
    p.alpha = 0.75f;
    Backend& be = ws.backend(side);
    be.set_gemm_mode(s_.mode);
    be.gemm(p);
  }

 private:
  GemmSpec s_;
  int64_t ld_x_ = 0, ld_w_ = 0, ld_y_ = 0;
  Buf<Bf16> w_;
  Buf<float> x_, y_;
};

// ---- elementwise ----

class SwigluCase final : public OpCase {
 public:
  SwigluCase(int rows, int inter) : rows_(rows), inter_(inter) {}
  std::string name() const override { return "swiglu"; }
  std::string vars() const override { return rows_vars(rows_, "inter=" + std::to_string(inter_)); }
  void init(Workspace& ws, testing::Rng& rng) override {
    std::vector<float> in = rng.normals(size_t(rows_) * 2 * inter_, 3.0f);
    in[0] = -120.0f;  // exp overflows: silu must give a signed zero, not NaN
    in_ = ws.input(in);
    out_ = ws.output<float>(size_t(rows_) * inter_, Check::nmse(kReductionNmse).per_row(inter_));
  }
  void run(Workspace& ws, Side side) override {
    SwigluParams p{ws.ptr(in_, side), ws.ptr(out_, side), rows_, inter_, 2 * inter_, inter_};
    ws.backend(side).swiglu(p);
  }

 private:
  int rows_, inter_;
  Buf<float> in_, out_;
};

class SoftmaxCase final : public OpCase {
 public:
  SoftmaxCase(int rows, int cols) : rows_(rows), cols_(cols) {}
  std::string name() const override { return "softmax"; }
  std::string vars() const override { return rows_vars(rows_, "cols=" + std::to_string(cols_)); }
  void init(Workspace& ws, testing::Rng& rng) override {
    std::vector<float> x = rng.normals(size_t(rows_) * cols_, 4.0f);
    x[0] = -std::numeric_limits<float>::infinity();  // a masked entry
    if (rows_ > 1) {                                 // a fully masked row: zeros, never NaN
      for (int i = 0; i < cols_; ++i)
        x[size_t(cols_) + i] = -std::numeric_limits<float>::infinity();
    }
    x_ = ws.inout(x, Check::nmse(kReductionNmse).per_row(cols_), RowLayout::kRowMajor);
  }
  void run(Workspace& ws, Side side) override {
    SoftmaxParams p{ws.ptr(x_, side), rows_, cols_, cols_};
    ws.backend(side).softmax(p);
  }

 private:
  int rows_, cols_;
  Buf<float> x_;
};

class EmbedCase final : public OpCase {
 public:
  EmbedCase(int rows, int dim) : rows_(rows), dim_(dim) {}
  std::string name() const override { return "embed"; }
  std::string vars() const override { return rows_vars(rows_, "dim=" + std::to_string(dim_)); }
  void init(Workspace& ws, testing::Rng& rng) override {
    table_ = ws.input(rng.bf16s(size_t(kVocab) * dim_));
    std::vector<int32_t> tokens(rows_);
    for (auto& t : tokens) t = int32_t(rng.integer(-3, kVocab + 3));  // some outside the vocab
    tokens_ = ws.input(tokens);
    out_ = ws.output<float>(size_t(rows_) * dim_, Check::exact());
  }
  void run(Workspace& ws, Side side) override {
    EmbedParams p{
        ws.ptr(tokens_, side), ws.ptr(table_, side), ws.ptr(out_, side), rows_, kVocab, dim_, dim_};
    ws.backend(side).embed(p);
  }

 private:
  static constexpr int kVocab = 97;
  int rows_, dim_;
  Buf<Bf16> table_;
  Buf<int32_t> tokens_;
  Buf<float> out_;
};

class AddCase final : public OpCase {
 public:
  AddCase(int rows, int dim) : rows_(rows), dim_(dim) {}
  std::string name() const override { return "add"; }
  std::string vars() const override { return rows_vars(rows_, "dim=" + std::to_string(dim_)); }
  void init(Workspace& ws, testing::Rng& rng) override {
    std::vector<float> x(size_t(rows_) * (dim_ + 3)), y(size_t(rows_) * dim_);
    for (int r = 0; r < rows_; ++r) {  // row-major draws, so row prefixes match across sizes
      for (int i = 0; i < dim_ + 3; ++i) x[size_t(r) * (dim_ + 3) + i] = rng.normal();
      for (int i = 0; i < dim_; ++i) y[size_t(r) * dim_ + i] = rng.normal();
    }
    x_ = ws.input(x);
    y_ = ws.inout(y, Check::exact(), RowLayout::kRowMajor);
  }
  void run(Workspace& ws, Side side) override {
    AddParams p{ws.ptr(x_, side), ws.ptr(y_, side), rows_, dim_, dim_ + 3, dim_};
    ws.backend(side).add(p);
  }

 private:
  int rows_, dim_;
  Buf<float> x_, y_;
};

// ---- the table ----

class ParityOps : public ParityTest {
 protected:
  void expect_all(const std::function<std::unique_ptr<OpCase>(int rows)>& make) {
    for (int rows : {1, 7, 64, 256}) {
      auto c = make(rows);
      EXPECT_TRUE(check_parity(*c, cpu(), cuda(), 4242 + rows));
    }
    EXPECT_TRUE(check_batch_invariance(
        make, std::vector<int>(std::begin(kInvarianceRows), std::end(kInvarianceRows)), cpu(),
        cuda()));
  }
};

// A warp per row up to 1024 columns, CTAs per row part above (several parts unless in place);
// pad 5 takes the element-wise path, pad 4 the 16-byte one.
TEST_F(ParityOps, RmsNorm) {
  for (int dim : {64, 512, 1024, 1028, 1536, 2048, 7168}) {
    for (int pad : {5, 4}) {
      for (bool in_place : {false, true}) {
        expect_all([&](int rows) {
          return std::make_unique<NormCase>(false, rows, dim, false, pad, in_place);
        });
      }
    }
  }
}

TEST_F(ParityOps, LayerNorm) {
  for (int dim : {128, 1000, 4096}) {
    for (bool bias : {false, true}) {
      for (int pad : {5, 4}) {
        expect_all(
            [&](int rows) { return std::make_unique<NormCase>(true, rows, dim, bias, pad); });
      }
    }
  }
  expect_all([&](int rows) { return std::make_unique<NormCase>(true, rows, 128, true, 4, true); });
}

// The bf16 copy is bf16 of the f32 output in every launch shape (warp, one CTA, several parts;
// 16-byte and element-wise), in place or not, and the padding between its rows stays untouched.
TEST_F(ParityOps, RmsNormBf16CopyInEveryShape) {
  testing::Rng rng(77);
  const Bf16 kUntouched{0x7FA5};
  for (int dim : {512, 1536, 7168, 1001}) {
    for (int rows : {1, 3, 300}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " rows " + std::to_string(rows) +
                     (in_place ? " in place" : ""));
        const int64_t ld = dim + 4, ld_b = dim + 8;
        const std::vector<float> x = rng.normals(size_t(rows) * ld, 2.0f);
        const std::vector<Bf16> weight = rng.bf16s(size_t(dim));
        Backend& be = cuda();
        DeviceArray<float> dx(be, x.size()), dy(be, x.size());
        DeviceArray<Bf16> dw(be, weight.size()), dyb(be, size_t(rows) * ld_b);
        be.copy_to_device(dx.data(), x.data(), dx.bytes());
        be.copy_to_device(dw.data(), weight.data(), dw.bytes());
        const std::vector<Bf16> untouched(dyb.size(), kUntouched);
        be.copy_to_device(dyb.data(), untouched.data(), dyb.bytes());
        float* y = in_place ? dx.data() : dy.data();
        be.rmsnorm({dx.data(), y, dw.data(), rows, dim, ld, ld, 1e-6f, dyb.data(), ld_b});
        std::vector<float> out(x.size());
        std::vector<Bf16> outb(dyb.size());
        be.copy_to_host(out.data(), y, out.size() * sizeof(float));
        be.copy_to_host(outb.data(), dyb.data(), dyb.bytes());
        for (int r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < ld_b; ++i) {
            const Bf16 got = outb[size_t(r * ld_b + i)];
            const Bf16 want = i < dim ? float_to_bf16(out[size_t(r * ld + i)]) : kUntouched;
            ASSERT_EQ(got.bits, want.bits) << "row " << r << " column " << i;
          }
        }
      }
    }
  }
}

TEST_F(ParityOps, Rope) {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    for (int heads : {1, 16}) {
      for (int offset : {0, 128}) {
        for (bool copy : {false, true}) {
          expect_all([&](int rows) {
            return std::make_unique<RopeCase>(style, rows, heads, offset, copy);
          });
        }
      }
    }
  }
}

// Below 32 a block per row; from 32 a warp per row (16-byte rows with pad 4, element-wise with 3).
TEST_F(ParityOps, Hadamard) {
  for (int dim : {1, 2, 16, 32, 64, 128, 256, 512, 1024}) {
    for (int pad : {4, 3}) {
      expect_all([&](int rows) { return std::make_unique<HadamardCase>(rows, dim, pad); });
    }
  }
}

TEST_F(ParityOps, GemmExactIsExact) {
  for (WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN}) {
    for (GemmOutput output : {GemmOutput::kOverwrite, GemmOutput::kAccumulate}) {
      // Small m takes the decode kernel, large m the tiled one: both must give the CPU's bits.
      for (auto [n, k] : {std::pair{64, 64}, std::pair{100, 37}, std::pair{576, 512},
                          std::pair{300, 2500}, std::pair{300, 2560}}) {
        expect_all([&](int rows) {
          return std::make_unique<GemmCase>(
              GemmSpec{rows, n, k, 1, layout, output, GemmMode::kExact});
        });
      }
      GemmCase batched({5, 96, 80, 3, layout, output, GemmMode::kExact});
      EXPECT_TRUE(check_parity(batched, cpu(), cuda()));
    }
  }
}

TEST_F(ParityOps, GemmFastWithinBf16Tolerance) {
  for (WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN}) {
    for (GemmOutput output : {GemmOutput::kOverwrite, GemmOutput::kAccumulate}) {
      for (int batch : {1, 3}) {
        for (int m : {1, 33, 256}) {
          GemmCase c({m, 200, 136, batch, layout, output, GemmMode::kFast});
          EXPECT_TRUE(check_parity(c, cpu(), cuda()));
        }
      }
    }
  }
}

// The bf16 copy rmsnorm writes is bf16 of its f32 output on both backends, and the fast GEMM that
// reads it gives the bits it gives when it converts x itself: the fusion only removes a kernel.
TEST_F(ParityOps, NormBf16CopyFeedsTheFastGemmUnchanged) {
  testing::Rng rng(21);
  const int rows = 5, dim = 1001, n = 300;
  const int64_t ld = dim + 3;
  const std::vector<float> x = rng.normals(size_t(rows) * ld, 2.0f);
  const std::vector<Bf16> weight = rng.bf16s(size_t(dim)), w = rng.bf16s(size_t(n) * dim, 0.2f);
  for (Backend* be : {&cpu(), &cuda()}) {
    DeviceArray<float> dx(*be, x.size()), dy(*be, size_t(rows) * dim);
    DeviceArray<float> out_given(*be, size_t(rows) * n), out_converted(*be, size_t(rows) * n);
    DeviceArray<Bf16> dweight(*be, weight.size()), dw(*be, w.size()), dyb(*be, size_t(rows) * dim);
    be->copy_to_device(dx.data(), x.data(), dx.bytes());
    be->copy_to_device(dweight.data(), weight.data(), dweight.bytes());
    be->copy_to_device(dw.data(), w.data(), dw.bytes());
    be->rmsnorm({dx.data(), dy.data(), dweight.data(), rows, dim, ld, dim, 1e-6f, dyb.data(), dim});
    std::vector<float> y(dy.size());
    std::vector<Bf16> yb(dyb.size());
    be->copy_to_host(y.data(), dy.data(), dy.bytes());
    be->copy_to_host(yb.data(), dyb.data(), dyb.bytes());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(yb[i].bits, float_to_bf16(y[i]).bits) << be->describe() << " element " << i;
    }
    if (be->kind() == BackendKind::kCpu) continue;
    be->set_gemm_mode(GemmMode::kFast);
    GemmParams g;
    g.x = dy.data();
    g.w = dw.data();
    g.m = rows, g.n = n, g.k = dim;
    g.ld_x = dim, g.ld_w = dim, g.ld_y = n;
    g.y = out_converted.data();
    be->gemm(g);
    g.x_bf16 = dyb.data();
    g.ld_x_bf16 = dim;
    g.y = out_given.data();
    be->gemm(g);
    std::vector<float> a(out_given.size()), b(out_converted.size());
    be->copy_to_host(a.data(), out_given.data(), out_given.bytes());
    be->copy_to_host(b.data(), out_converted.data(), out_converted.bytes());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

TEST_F(ParityOps, Swiglu) {
  for (int inter : {7, 1024}) {
    expect_all([&](int rows) { return std::make_unique<SwigluCase>(rows, inter); });
  }
}

TEST_F(ParityOps, Softmax) {
  for (int cols : {1, 100, 2048, 5000}) {
    expect_all([&](int rows) { return std::make_unique<SoftmaxCase>(rows, cols); });
  }
}

TEST_F(ParityOps, Embed) {
  for (int dim : {8, 12, 1000, 7168}) {  // 12: not a multiple of 8, the element-wise path
    expect_all([&](int rows) { return std::make_unique<EmbedCase>(rows, dim); });
  }
}

TEST_F(ParityOps, Add) {
  for (int dim : {3, 1024}) {
    expect_all([&](int rows) { return std::make_unique<AddCase>(rows, dim); });
  }
}

}  // namespace
}  // namespace dsa::parity
