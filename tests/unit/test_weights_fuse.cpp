// Weights::fuse_rows: the fused tensor holds the parts' rows in order (bf16 values, or fp8 codes
// with their block scales when every part is fp8 and every part but the last fills whole 128-row
// blocks; otherwise the parts' bf16 values, fp8 ones dequantized), the parts are gone, bad input is
// refused by name, and the CPU GEMM over the fused matrix gives exactly the parts' GEMMs, column
// block by column block, bf16 and fp8 (what the model's fused projections rely on).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/test_util.h"
#include "dsa/backend.h"
#include "dsa/checkpoint.h"
#include "dsa/error.h"
#include "dsa/model.h"

namespace dsa {
namespace {

using testing::expect_error;
using testing::Rng;

struct Part {
  std::string name;
  int64_t rows;
  bool fp8;
};

class WeightsFuse : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend();
  Rng rng_{20261204};

  // Adds the parts to w (random bf16 values; fp8 ones quantized by write_checkpoint's block
  // quantizer) and returns each part's bf16 values as the model would multiply them.
  std::vector<std::vector<Bf16>> add_parts(Weights& w, const std::vector<Part>& parts,
                                           int64_t cols) {
    std::vector<std::vector<Bf16>> values;
    for (const Part& p : parts) {
      const std::vector<Bf16> host = rng_.bf16s(size_t(p.rows * cols), 0.05f);
      if (p.fp8) {
        const Fp8Blocks q = quantize_fp8_blocks(host.data(), p.rows, cols);
        w.add_fp8(*be_, p.name, {p.rows, cols}, q.bytes, q.scales);
      } else {
        w.add(*be_, p.name, {p.rows, cols}, host);
      }
      values.push_back(w.host_bf16(*be_, p.name));
    }
    return values;
  }

  static std::vector<std::string> names(const std::vector<Part>& parts) {
    std::vector<std::string> out;
    for (const Part& p : parts) out.push_back(p.name);
    return out;
  }

  // y[m, n] of the CPU GEMM over w (m rows of x, k = cols).
  std::vector<float> gemm(const WeightMatrix& w, const std::vector<float>& x, int m, int n, int k) {
    std::vector<float> y(size_t(m) * n, testing::kPoison);
    GemmParams g;
    g.x = x.data();
    g.w = w.bf16;
    g.w_fp8 = w.fp8;
    g.w_scale = w.scale;
    g.ld_w_scale = (k + kGemmFp8Block - 1) / kGemmFp8Block;
    g.y = y.data();
    g.m = m, g.n = n, g.k = k;
    g.ld_x = k, g.ld_w = k, g.ld_y = n;
    be_->gemm(g);
    return y;
  }

  // Fuses `parts` (cols columns) and checks the fused tensor: its dtype, its values, the parts'
  // absence, and the GEMM over it against each part's own GEMM, bit for bit.
  void check(const std::vector<Part>& parts, int64_t cols, bool expect_fp8) {
    Weights w;
    const std::vector<std::vector<Bf16>> values = add_parts(w, parts, cols);
    std::vector<WeightMatrix> before;
    int64_t rows = 0;
    for (const Part& p : parts) {
      before.push_back(w.matrix(p.name, {p.rows, cols}));
      rows += p.rows;
    }
    // The parts' GEMMs before fusing (fuse_rows frees their tensors).
    const int m = 3;
    const std::vector<float> x = rng_.normals(size_t(m * cols));
    std::vector<std::vector<float>> y_parts;
    for (size_t i = 0; i < parts.size(); ++i) {
      y_parts.push_back(gemm(before[i], x, m, int(parts[i].rows), int(cols)));
    }

    w.fuse_rows(*be_, "fused", names(parts));
    for (const Part& p : parts) EXPECT_FALSE(w.contains(p.name)) << p.name;
    const WeightMatrix fused = w.matrix("fused", {rows, cols});
    EXPECT_EQ(fused.fp8 != nullptr, expect_fp8);
    EXPECT_EQ(fused.bf16 != nullptr, !expect_fp8);
    const std::vector<Bf16> got = w.host_bf16(*be_, "fused");
    ASSERT_EQ(got.size(), size_t(rows * cols));
    size_t at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      EXPECT_EQ(std::memcmp(got.data() + at, values[i].data(), values[i].size() * 2), 0)
          << "the rows of " << parts[i].name;
      at += values[i].size();
    }

    const std::vector<float> y = gemm(fused, x, m, int(rows), int(cols));
    int64_t col0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      for (int r = 0; r < m; ++r) {
        EXPECT_EQ(std::memcmp(y.data() + r * rows + col0, y_parts[i].data() + r * parts[i].rows,
                              size_t(parts[i].rows) * 4),
                  0)
            << parts[i].name << " row " << r;
      }
      col0 += parts[i].rows;
    }
  }
};

TEST_F(WeightsFuse, Bf16PartsKeepTheirRowsAndOutputs) {
  check({{"q_a", 96, false}, {"wk", 16, false}, {"kv_a", 72, false}}, 200, false);
}

// The V3.2 x projection's order: q_a (12 blocks of rows), wk (one), kv_a (4.5: the last part may
// end inside a block). The fused scales are the parts' rows of scales, stacked.
TEST_F(WeightsFuse, Fp8PartsOnWholeBlocksStayFp8) {
  check({{"q_a", 256, true}, {"wk", 128, true}, {"kv_a", 200, true}}, 300, true);
}

// A part before the last that ends inside a 128-row block would shift the later parts' rows
// against their scale blocks: the fused tensor is then bf16, the same values, the same outputs.
TEST_F(WeightsFuse, Fp8PartOffTheBlockGridFallsBackToBf16) {
  check({{"kv_a", 200, true}, {"wk", 128, true}}, 160, false);
}

TEST_F(WeightsFuse, MixedPartsFuseAsBf16) {
  check({{"gate", 128, true}, {"up", 128, false}}, 256, false);
}

TEST_F(WeightsFuse, RefusesBadParts) {
  Weights w;
  add_parts(w, {{"a", 8, false}, {"b", 8, false}, {"c", 4, false}}, 16);
  w.add(*be_, "norm", {16}, rng_.bf16s(16));
  w.add(*be_, "wide", {8, 32}, rng_.bf16s(8 * 32));
  expect_error(
      [&] {
        w.fuse_rows(*be_, "f", {"a", "missing"});
      },
      ErrorCode::kInvalidArgument, {"missing"});
  expect_error(
      [&] {
        w.fuse_rows(*be_, "f", {"a", "wide"});
      },
      ErrorCode::kInvalidArgument, {"wide", "[8, 32]", "16 columns"});
  expect_error(
      [&] {
        w.fuse_rows(*be_, "f", {"norm", "a"});
      },
      ErrorCode::kInvalidArgument, {"norm", "not a matrix"});
  expect_error(
      [&] {
        w.fuse_rows(*be_, "c", {"a", "b"});
      },
      ErrorCode::kInvalidArgument, {"c", "new tensor"});
  expect_error([&] { w.fuse_rows(*be_, "f", {}); }, ErrorCode::kInvalidArgument, {"f"});
  // Nothing was fused or freed by a refused call.
  for (const char* name : {"a", "b", "c", "norm", "wide"}) EXPECT_TRUE(w.contains(name)) << name;
  EXPECT_FALSE(w.contains("f"));
}

}  // namespace
}  // namespace dsa
