// Parity of the MoE ops and the MoE MLP between the CPU reference and CUDA.
//   moe_route:  ids exact, weights by nmse (expf vs the host's exp); batch-invariant.
//   scale_rows: exact.
//   MoE MLP:    nmse against the CPU, bitwise equal between an eager run and a graph replay.
#include <cstring>
#include <string>
#include <vector>

#include "model/moe.h"
#include "parity/parity_harness.h"

namespace dsa::parity {
namespace {

constexpr double kExpNmse = 1e-12;

class MoeRouteCase final : public OpCase {
 public:
  MoeRouteCase(int rows, int experts, int top_k, bool bias)
      : rows_(rows), experts_(experts), top_k_(top_k), bias_(bias) {}
  std::string name() const override { return "moe_route"; }
  std::string vars() const override {
    return "rows=" + std::to_string(rows_) + ",experts=" + std::to_string(experts_) +
           ",top_k=" + std::to_string(top_k_) + (bias_ ? ",bias" : "");
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    std::vector<Bf16> bias(experts_);
    for (auto& b : bias) b = float_to_bf16(rng.uniform(-0.1f, 0.1f));
    bias_buf_ = ws.input(bias);
    ld_ = experts_ + 3;
    std::vector<float> logits(size_t(rows_) * ld_);
    for (int r = 0; r < rows_; ++r) {
      const bool ties = r % 5 == 4;  // some rows with all logits equal: ties to the lower id
      const float same = rng.normal(2.0f);
      for (int e = 0; e < ld_; ++e) logits[r * ld_ + e] = ties ? same : rng.normal(2.0f);
    }
    logits_ = ws.input(logits);
    weights_ = ws.output<float>(size_t(rows_) * experts_, Check::nmse(kExpNmse).per_row(experts_));
    ids_ = ws.output<int32_t>(size_t(rows_) * top_k_, Check::exact());
  }
  void run(Workspace& ws, Side side) override {
    MoeRouteParams p;
    p.logits = ws.ptr(logits_, side);
    p.bias = bias_ ? ws.ptr(bias_buf_, side) : nullptr;
    p.weights = ws.ptr(weights_, side);
    p.expert_ids = ws.ptr(ids_, side);
    p.rows = rows_;
    p.n_experts = experts_;
    p.top_k = top_k_;
    p.ld_logits = ld_;
    p.ld_weights = experts_;
    p.ld_expert_ids = top_k_;
    p.scaling = 2.5f;
    ws.backend(side).moe_route(p);
  }

 private:
  int rows_, experts_, top_k_;
  bool bias_;
  int64_t ld_ = 0;
  Buf<Bf16> bias_buf_;
  Buf<float> logits_, weights_;
  Buf<int32_t> ids_;
};

class ScaleRowsCase final : public OpCase {
 public:
  ScaleRowsCase(int rows, int dim) : rows_(rows), dim_(dim) {}
  std::string name() const override { return "scale_rows"; }
  std::string vars() const override {
    return "rows=" + std::to_string(rows_) + ",dim=" + std::to_string(dim_);
  }
  void init(Workspace& ws, testing::Rng& rng) override {
    scale_ = ws.input(rng.normals(size_t(rows_) * 8));
    x_ = ws.inout(rng.normals(size_t(rows_) * dim_), Check::exact(), RowLayout::kRowMajor);
  }
  void run(Workspace& ws, Side side) override {
    ws.backend(side).scale_rows({ws.ptr(x_, side), ws.ptr(scale_, side) + 5, rows_, dim_, dim_, 8});
  }

 private:
  int rows_, dim_;
  Buf<float> scale_, x_;
};

class ParityMoe : public ParityTest {
 protected:
  void moe_mlp_case(bool fused);
};

TEST_F(ParityMoe, Route) {
  for (auto [experts, top_k] : {std::pair{8, 2}, {64, 6}, {256, 8}}) {
    for (bool bias : {false, true}) {
      auto make = [&](int rows) {
        return std::make_unique<MoeRouteCase>(rows, experts, top_k, bias);
      };
      for (int rows : {1, 7, 64, 256}) {
        auto c = make(rows);
        EXPECT_TRUE(check_parity(*c, cpu(), cuda(), 77 + rows));
      }
      EXPECT_TRUE(check_batch_invariance(make, {1, 7, 64, 256}, cpu(), cuda()));
    }
  }
}

TEST_F(ParityMoe, ScaleRows) {
  for (int rows : {1, 7, 64}) {
    ScaleRowsCase c(rows, 300);
    EXPECT_TRUE(check_parity(c, cpu(), cuda(), 5 + rows));
  }
}

// The whole MoE MLP of the tiny-moe preset's layer 1: CPU vs CUDA, and CUDA eager vs a replay of
// the same forward captured in a graph (routing must not sync with the host); with each expert's
// gate and up as two GEMMs, and fused into one (fuse_expert_gate_up, as Model runs them).
TEST_F(ParityMoe, MoeMlpMatchesCpuAndReplaysInAGraph) {
  for (bool fused : {false, true}) moe_mlp_case(fused);
}

void ParityMoe::moe_mlp_case(bool fused) {
  SCOPED_TRACE(fused ? "gate_up fused" : "gate and up apart");
  const ModelConfig config = preset_config("tiny-moe");
  const int rows = 12, hidden = config.hidden_size;
  testing::Rng rng(31);
  const std::vector<float> x = rng.normals(size_t(rows) * hidden);
  const std::vector<float> y0 = rng.normals(size_t(rows) * hidden);
  auto run = [&](Backend& be, bool graph) {
    Weights weights = Weights::synthetic(be, config, 3);
    if (fused) fuse_expert_gate_up(be, config, weights);
    MoeMlp moe(be, config, weights, rows);
    DeviceArray<float> dx(be, x.size()), dy(be, y0.size());
    be.copy_to_device(dx.data(), x.data(), x.size() * sizeof(float));
    be.copy_to_device(dy.data(), y0.data(), y0.size() * sizeof(float));
    if (graph) {
      auto g = be.capture([&] { moe.forward(1, dx.data(), dy.data(), rows); });
      be.copy_to_device(dy.data(), y0.data(), y0.size() * sizeof(float));
      g->replay();
    } else {
      moe.forward(1, dx.data(), dy.data(), rows);
    }
    std::vector<float> y(y0.size());
    be.copy_to_host(y.data(), dy.data(), y.size() * sizeof(float));
    return y;
  };
  // Against the CPU with the exact gemm: the invariant one rounds x to bf16, which can move a
  // router logit enough to pick another expert.
  const std::vector<float> ref = run(cpu(), false);
  cuda().set_gemm_mode(GemmMode::kExact);
  const std::vector<float> eager = run(cuda(), false);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(ref[i]) - eager[i]) * (double(ref[i]) - eager[i]);
    den += double(ref[i]) * ref[i];
  }
  EXPECT_LT(num / den, 1e-10);
  for (GemmMode mode : {GemmMode::kExact, GemmMode::kBatchInvariant}) {
    cuda().set_gemm_mode(mode);
    const std::vector<float> e = run(cuda(), false), replay = run(cuda(), true);
    EXPECT_EQ(std::memcmp(e.data(), replay.data(), e.size() * sizeof(float)), 0)
        << gemm_mode_name(mode);
  }
  cuda().set_gemm_mode(GemmMode::kBatchInvariant);
}

}  // namespace
}  // namespace dsa::parity
