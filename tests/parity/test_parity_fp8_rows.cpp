// The producers' fp8 rows on CUDA (Fp8Rows, ops.h): RMSNorm's y_fp8 and SwiGLU's out_fp8, written
// in the op's own kernel when its warps hold whole 128-column blocks, else by the quantizer after
// it. Either way they must be the group encoder's bytes and scales of the values the op wrote
// (the CPU's encoder on the CUDA op's f32 output, bit for bit), only for the batch's rows, and a
// w8a8 GEMM given them (GemmParams::x8) must give the bits of the GEMM that quantizes x itself.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "common/expect_error.h"
#include "common/test_util.h"
#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

constexpr uint8_t kCodePoison = 0xA5;
constexpr float kScalePoison = -7.25f;

class ParityFp8Rows : public ParityTest {
 protected:
  // Device buffers for rows x cols fp8 rows with capacity `cap` rows, poisoned.
  struct Rows {
    DeviceArray<uint8_t> codes;
    DeviceArray<float> scales;
    Fp8Rows view;
    int64_t blocks = 0;
  };
  Rows make_rows(int cap, int cols, int64_t ld) {
    Rows r;
    r.blocks = (cols + kFp8BlockCols - 1) / kFp8BlockCols;
    const int64_t ld_scales = (cap + 7) / 8 * 8;
    r.codes = DeviceArray<uint8_t>(cuda(), size_t(cap * ld));
    r.scales = DeviceArray<float>(cuda(), size_t(r.blocks * ld_scales));
    const std::vector<uint8_t> c(r.codes.size(), kCodePoison);
    const std::vector<float> s(r.scales.size(), kScalePoison);
    cuda().copy_to_device(r.codes.data(), c.data(), c.size());
    cuda().copy_to_device(r.scales.data(), s.data(), s.size() * sizeof(float));
    r.view = {r.codes.data(), r.scales.data(), ld, ld_scales};
    return r;
  }
  template <typename T>
  DeviceArray<T> upload(const std::vector<T>& host) {
    DeviceArray<T> d(cuda(), host.size());
    cuda().copy_to_device(d.data(), host.data(), host.size() * sizeof(T));
    return d;
  }
  template <typename T>
  std::vector<T> download(const DeviceArray<T>& d) {
    std::vector<T> h(d.size());
    cuda().copy_to_host(h.data(), d.data(), h.size() * sizeof(T));
    return h;
  }
  // The device's rows against the CPU encoder on `values` (rows x cols, row stride ld_values);
  // the codes past cols and the rows past `rows` keep their poison.
  void expect_rows(Rows& r, const std::vector<float>& values, int64_t ld_values, int rows, int cols,
                   const std::string& what) {
    const std::vector<uint8_t> got_codes = download(r.codes);
    const std::vector<float> got_scales = download(r.scales);
    std::vector<uint8_t> want_codes(got_codes.size(), kCodePoison);
    std::vector<float> want_scales(got_scales.size(), kScalePoison);
    const Fp8Rows want{want_codes.data(), want_scales.data(), r.view.ld, r.view.ld_scales};
    for (int row = 0; row < rows; ++row) {
      cpu::encode_fp8_rows(values.data() + row * ld_values, cols, row, want);
    }
    size_t bad = 0;
    for (size_t i = 0; i < got_codes.size(); ++i) {
      if (got_codes[i] != want_codes[i] && bad++ < 3) {
        ADD_FAILURE() << what << ": code " << i << " (row " << i / r.view.ld << ") is "
                      << int(got_codes[i]) << ", the encoder's " << int(want_codes[i]);
      }
    }
    for (size_t i = 0; i < got_scales.size(); ++i) {
      if (std::memcmp(&got_scales[i], &want_scales[i], sizeof(float)) != 0 && bad++ < 6) {
        ADD_FAILURE() << what << ": scale " << i << " (block " << i / r.view.ld_scales << ", row "
                      << i % r.view.ld_scales << ") is " << got_scales[i] << ", the encoder's "
                      << want_scales[i];
      }
    }
    EXPECT_EQ(bad, 0u) << what;
  }
};

// dims: whole blocks in the warp kernel (512) and the part-split one (1536, 7168: a lone row
// over several CTAs), a short last block (1040: the quantizer after the norm), an odd row stride
// (the element-by-element path: the quantizer too). Rows with very different magnitudes and one
// all-zero row.
TEST_F(ParityFp8Rows, RmsNormWritesTheEncodersRows) {
  testing::Rng rng(41);
  for (const auto [dim, pad] : {std::pair{512, 4}, {1536, 0}, {7168, 0}, {1040, 8}, {256, 3}}) {
    for (int rows : {1, 5, 64}) {
      const int64_t ld = dim + pad;
      std::vector<float> x(size_t(rows * ld));
      for (int r = 0; r < rows; ++r) {
        const float gain = r == 1 ? 0.0f : std::ldexp(1.0f, (r * 5) % 20 - 10);
        for (int i = 0; i < ld; ++i) x[size_t(r * ld + i)] = gain * rng.normal(2.0f);
      }
      // y's pad columns are never written: poison them, so all of y is defined when read back.
      DeviceArray<float> dx = upload(x), dy = upload(std::vector<float>(x.size(), kScalePoison));
      DeviceArray<Bf16> dw = upload(rng.bf16s(dim));
      Rows out = make_rows(rows + 3, dim, (dim + 15) / 16 * 16);
      RmsNormParams p{dx.data(), dy.data(), dw.data(), rows, dim, ld, ld, 1e-6f};
      p.y_fp8 = out.view;
      cuda().rmsnorm(p);
      expect_rows(out, download(dy), ld, rows, dim,
                  "rmsnorm dim " + std::to_string(dim) + " pad " + std::to_string(pad) + " rows " +
                      std::to_string(rows));
    }
  }
}

TEST_F(ParityFp8Rows, SwigluWritesTheEncodersRows) {
  testing::Rng rng(43);
  for (int inter : {18432, 512, 1040}) {
    for (int rows : {1, 7}) {
      std::vector<float> in = rng.normals(size_t(rows) * 2 * inter, 3.0f);
      in[0] = -120.0f;
      DeviceArray<float> din = upload(in), dout(cuda(), size_t(rows) * inter);
      Rows out = make_rows(rows + 1, inter, inter);
      SwigluParams p{din.data(), dout.data(), rows, inter, 2 * inter, inter};
      p.out_fp8 = out.view;
      cuda().swiglu(p);
      expect_rows(out, download(dout), inter, rows, inter,
                  "swiglu inter " + std::to_string(inter) + " rows " + std::to_string(rows));
    }
  }
}

// The w8a8 GEMM given the norm's fp8 rows gives the bits of the one that quantizes the norm's y
// itself, at batch sizes past a tile's rows (the scales of rows past the batch are read there).
TEST_F(ParityFp8Rows, GemmGivenTheRowsGivesTheSameBits) {
  testing::Rng rng(47);
  const int n = 200, k = 1024;
  std::vector<uint8_t> w(size_t(n) * k);
  for (auto& b : w) b = uint8_t(rng.uniform(0, 255)) & 0x7E;  // finite e4m3 codes
  std::vector<float> ws(size_t((n + 127) / 128) * (k / 128));
  for (auto& s : ws) s = rng.uniform(0.01f, 0.1f);
  DeviceArray<uint8_t> dw = upload(w);
  DeviceArray<float> dws = upload(ws);
  for (int rows : {1, 9, 70}) {
    DeviceArray<float> dx = upload(rng.normals(size_t(rows) * k, 2.0f));
    DeviceArray<float> dy(cuda(), size_t(rows) * k);
    DeviceArray<Bf16> dnw = upload(rng.bf16s(k));
    Rows x8 = make_rows(rows, k, k);
    RmsNormParams norm{dx.data(), dy.data(), dnw.data(), rows, k, k, k, 1e-6f};
    norm.y_fp8 = x8.view;
    cuda().rmsnorm(norm);
    std::vector<std::vector<float>> outs;
    for (bool given : {false, true}) {
      DeviceArray<float> out(cuda(), size_t(rows) * n);
      GemmParams g;
      g.x = dy.data(), g.y = out.data();
      g.m = rows, g.n = n, g.k = k;
      g.ld_x = k, g.ld_y = n, g.ld_w = k;
      g.w_fp8 = dw.data(), g.w_scale = dws.data(), g.ld_w_scale = k / 128;
      g.x_fp8 = true;
      if (given) g.x8 = x8.view;
      cuda().set_gemm_mode(GemmMode::kBatchInvariant);
      cuda().gemm(g);
      outs.push_back(download(out));
    }
    ASSERT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)), 0)
        << "rows " << rows;
  }
}

TEST_F(ParityFp8Rows, RefusesRowsItCannotWrite) {
  DeviceArray<float> x(cuda(), 1000), y(cuda(), 1000);
  DeviceArray<Bf16> w(cuda(), 1000);
  Rows out = make_rows(1, 1000, 1000);
  RmsNormParams p{x.data(), y.data(), w.data(), 1, 1000, 1000, 1000, 1e-6f};
  p.y_fp8 = out.view;  // 1000 columns: not a multiple of 16
  testing::expect_error([&] { cuda().rmsnorm(p); }, ErrorCode::kInvalidArgument,
                        {"rmsnorm", "multiple of 16"});
}

}  // namespace
}  // namespace dsa::parity
