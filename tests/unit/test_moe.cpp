// MoE: the router op against a float64 reference (ties included), the MoE MLP against a naive
// float64 layer, batch invariance, and the tiny-moe preset generating deterministically in eager
// and graph modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "common/test_util.h"
#include "dsa/error.h"
#include "dsa/generate.h"
#include "dsa/runner.h"
#include "model/moe.h"

namespace dsa {
namespace {

using testing::Rng;

struct RouteRef {
  std::vector<int32_t> ids;     // best first
  std::vector<double> weights;  // dense [n_experts]
};

// DeepSeek-V3 routing in float64: top-k of sigmoid + bias, ties to the lower id.
RouteRef route_ref(const float* logits, const std::vector<float>& bias, int n, int k,
                   double scaling) {
  std::vector<double> score(n), choice(n);
  for (int e = 0; e < n; ++e) {
    score[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
    choice[e] = score[e] + (bias.empty() ? 0.0 : double(bias[e]));
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  RouteRef r;
  r.ids.assign(order.begin(), order.begin() + k);
  double sum = 0;
  for (int32_t e : r.ids) sum += score[e];
  r.weights.assign(n, 0.0);
  for (int32_t e : r.ids) r.weights[e] = score[e] / sum * scaling;
  return r;
}

void check_route(int rows, int n, int k, bool with_bias, Rng& rng, bool ties) {
  std::vector<float> logits(size_t(rows) * n);
  for (auto& v : logits) v = rng.normal(2.0f);
  std::vector<Bf16> bias_bf16(n);
  std::vector<float> bias;
  for (int e = 0; e < n; ++e) {
    bias_bf16[e] = float_to_bf16(rng.uniform(-0.1f, 0.1f));
    if (ties && e % 3 == 1) bias_bf16[e] = bias_bf16[e - 1];  // equal-bias pairs
  }
  if (with_bias) {
    for (Bf16 b : bias_bf16) bias.push_back(bf16_to_float(b));
  }
  if (ties) {
    for (int r = 0; r < rows; r += 2) {  // every other row: all logits equal
      std::fill(logits.begin() + r * n, logits.begin() + (r + 1) * n, rng.normal());
    }
  }
  std::vector<float> weights(size_t(rows) * n, testing::kPoison);
  std::vector<int32_t> ids(size_t(rows) * k, -7);
  MoeRouteParams p;
  p.logits = logits.data();
  p.bias = with_bias ? bias_bf16.data() : nullptr;
  p.weights = weights.data();
  p.expert_ids = ids.data();
  p.rows = rows;
  p.n_experts = n;
  p.top_k = k;
  p.ld_logits = p.ld_weights = n;
  p.ld_expert_ids = k;
  p.scaling = 2.5f;
  make_cpu_backend()->moe_route(p);
  for (int r = 0; r < rows; ++r) {
    const RouteRef ref = route_ref(&logits[r * n], bias, n, k, 2.5);
    for (int i = 0; i < k; ++i) ASSERT_EQ(ids[r * k + i], ref.ids[i]) << "row " << r << " k " << i;
    for (int e = 0; e < n; ++e) {
      const float w = weights[r * n + e];
      if (ref.weights[e] == 0.0) {
        ASSERT_EQ(w, 0.0f) << "row " << r << " expert " << e;
      } else {
        ASSERT_NEAR(w, ref.weights[e], 1e-6 * ref.weights[e]) << "row " << r << " expert " << e;
      }
    }
  }
}

TEST(MoeRoute, MatchesFloat64Reference) {
  Rng rng(11);
  check_route(9, 16, 4, true, rng, false);
  check_route(5, 8, 2, false, rng, false);
  check_route(3, 256, 8, true, rng, false);
  check_route(4, 5, 5, true, rng, false);  // k = n: every expert, weights sum to scaling
}

TEST(MoeRoute, TiesGoToTheLowerExpertId) {
  Rng rng(12);
  check_route(6, 12, 3, true, rng, true);
  check_route(6, 12, 5, false, rng, true);
  // Without bias, equal logits select experts 0..k-1 exactly.
  std::vector<float> logits(8, 0.25f), weights(8, testing::kPoison);
  std::vector<int32_t> ids(3, -7);
  MoeRouteParams p{logits.data(), nullptr, weights.data(), ids.data(), 1, 8, 3, 8, 8, 3, 1.0f};
  make_cpu_backend()->moe_route(p);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
  for (int e = 0; e < 8; ++e) EXPECT_FLOAT_EQ(weights[e], e < 3 ? 1.0f / 3 : 0.0f);
}

TEST(MoeRoute, RejectsBadShapes) {
  std::vector<float> buf(16);
  auto be = make_cpu_backend();
  MoeRouteParams p{buf.data(), nullptr, buf.data(), nullptr, 1, 4, 5, 4, 4, 0, 1.0f};
  EXPECT_THROW(be->moe_route(p), Error);  // top_k > n_experts
  p.top_k = 2;
  p.n_experts = 300;
  EXPECT_THROW(be->moe_route(p), Error);  // over kMaxRoutedExperts
}

TEST(MoeScaleRows, ScalesEachRowByItsColumnEntry) {
  Rng rng(13);
  std::vector<float> x = rng.normals(4 * 10), scale = rng.normals(4 * 3);
  const std::vector<float> x0 = x;
  make_cpu_backend()->scale_rows({x.data(), scale.data() + 2, 4, 7, 10, 3});
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(x[r * 10 + i], i < 7 ? x0[r * 10 + i] * scale[r * 3 + 2] : x0[r * 10 + i]);
    }
  }
}

// ---- the MoE MLP against a naive float64 layer ----

ModelConfig moe_config() {
  ModelConfig c;
  c.hidden_size = 64;
  c.num_hidden_layers = 1;
  c.first_k_dense_replace = 0;
  c.n_routed_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.n_shared_experts = 2;
  c.routed_scaling_factor = 1.5;
  return c;
}

struct HostMoe {
  std::map<std::string, std::vector<Bf16>> w;
  std::vector<double> f64(const std::string& name) const {
    std::vector<double> v;
    for (Bf16 b : w.at(name)) v.push_back(bf16_to_float(b));
    return v;
  }
};

HostMoe random_moe(Backend& be, const ModelConfig& c, Weights& weights, Rng& rng) {
  HostMoe h;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float stddev) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    h.w[name] = rng.bf16s(size_t(n), stddev);
    weights.add(be, name, shape, h.w[name]);
  };
  const int64_t H = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const int64_t S = I * c.n_shared_experts;
  add("model.layers.0.mlp.gate.weight", {E, H}, 0.2f);
  add("model.layers.0.mlp.gate.e_score_correction_bias", {E}, 0.1f);
  for (int e = 0; e < E; ++e) {
    const std::string x = fmt::format("model.layers.0.mlp.experts.{}.", e);
    add(x + "gate_proj.weight", {I, H}, 0.15f);
    add(x + "up_proj.weight", {I, H}, 0.15f);
    add(x + "down_proj.weight", {H, I}, 0.2f);
  }
  add("model.layers.0.mlp.shared_experts.gate_proj.weight", {S, H}, 0.15f);
  add("model.layers.0.mlp.shared_experts.up_proj.weight", {S, H}, 0.15f);
  add("model.layers.0.mlp.shared_experts.down_proj.weight", {H, S}, 0.15f);
  return h;
}

// down(silu(gate x) * up x) * scale, in float64.
std::vector<double> swiglu_mlp(const HostMoe& h, const std::string& prefix, int inter, int hidden,
                               const float* x, double scale) {
  const auto g = h.f64(prefix + "gate_proj.weight"), u = h.f64(prefix + "up_proj.weight");
  const auto d = h.f64(prefix + "down_proj.weight");
  std::vector<double> act(inter), out(hidden, 0.0);
  for (int i = 0; i < inter; ++i) {
    double a = 0, b = 0;
    for (int k = 0; k < hidden; ++k) a += g[i * hidden + k] * x[k], b += u[i * hidden + k] * x[k];
    act[i] = a / (1 + std::exp(-a)) * b;
  }
  for (int o = 0; o < hidden; ++o) {
    for (int i = 0; i < inter; ++i) out[o] += d[o * inter + i] * act[i];
    out[o] *= scale;
  }
  return out;
}

TEST(MoeMlp, MatchesNaiveFloat64Layer) {
  const ModelConfig c = moe_config();
  auto be = make_cpu_backend();
  Rng rng(21);
  Weights weights;
  const HostMoe h = random_moe(*be, c, weights, rng);
  const int rows = 7, H = c.hidden_size, E = c.n_routed_experts;
  const std::vector<float> x = rng.normals(size_t(rows) * H), y0 = rng.normals(size_t(rows) * H);
  std::vector<float> y = y0;
  MoeMlp moe(*be, c, weights, 8);
  moe.forward(0, x.data(), y.data(), rows);

  const auto router = h.f64("model.layers.0.mlp.gate.weight");
  std::vector<float> bias;
  for (Bf16 b : h.w.at("model.layers.0.mlp.gate.e_score_correction_bias")) {
    bias.push_back(bf16_to_float(b));
  }
  std::vector<double> got, want;
  std::vector<int> experts_used(E, 0);
  for (int r = 0; r < rows; ++r) {
    const float* xr = &x[r * H];
    std::vector<float> logits(E);
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int k = 0; k < H; ++k) s += router[e * H + k] * xr[k];
      logits[e] = float(s);
    }
    const RouteRef ref =
        route_ref(logits.data(), bias, E, c.num_experts_per_tok, c.routed_scaling_factor);
    std::vector<double> out = swiglu_mlp(h, "model.layers.0.mlp.shared_experts.",
                                         c.moe_intermediate_size * c.n_shared_experts, H, xr, 1.0);
    for (int32_t e : ref.ids) {
      ++experts_used[e];
      const auto o = swiglu_mlp(h, fmt::format("model.layers.0.mlp.experts.{}.", e),
                                c.moe_intermediate_size, H, xr, ref.weights[e]);
      for (int i = 0; i < H; ++i) out[i] += o[i];
    }
    for (int i = 0; i < H; ++i) {
      want.push_back(out[i]);
      got.push_back(double(y[r * H + i]) - double(y0[r * H + i]));
    }
  }
  EXPECT_LT(testing::rel_error(got, want), 1e-5);
  EXPECT_GT(std::count_if(experts_used.begin(), experts_used.end(), [](int n) { return n > 0; }),
            2);
}

TEST(MoeMlp, RowsAreBatchInvariant) {
  const ModelConfig c = moe_config();
  auto be = make_cpu_backend();
  Rng rng(22);
  Weights weights;
  random_moe(*be, c, weights, rng);
  const int H = c.hidden_size;
  const std::vector<float> x = rng.normals(size_t(8) * H), y0 = rng.normals(size_t(8) * H);
  MoeMlp moe(*be, c, weights, 8);
  std::vector<float> all = y0, one = y0;
  moe.forward(0, x.data(), all.data(), 8);
  moe.forward(0, x.data() + 3 * H, one.data() + 3 * H, 1);
  EXPECT_EQ(std::memcmp(all.data() + 3 * H, one.data() + 3 * H, H * sizeof(float)), 0);
  EXPECT_THROW(moe.forward(0, x.data(), all.data(), 9), Error);
}

// Each expert's gate and up fused into one gate_up_proj (fuse_expert_gate_up, as Model does): one
// GEMM per expert instead of two, and exactly the same bits, since every output column reads its
// own weight row.
TEST(MoeMlp, FusedGateUpGivesTheSameBits) {
  const ModelConfig c = moe_config();
  auto be = make_cpu_backend();
  Weights separate, fused;
  Rng a(23), b(23);
  random_moe(*be, c, separate, a);
  random_moe(*be, c, fused, b);
  fuse_expert_gate_up(*be, c, fused);
  EXPECT_TRUE(fused.contains("model.layers.0.mlp.experts.0.gate_up_proj.weight"));
  EXPECT_FALSE(fused.contains("model.layers.0.mlp.experts.0.gate_proj.weight"));
  EXPECT_TRUE(fused.contains("model.layers.0.mlp.shared_experts.gate_up_proj.weight"));
  const MoeLayerWeights w = moe_layer_weights(fused, c, 0);
  ASSERT_EQ(int(w.experts.size()), c.n_routed_experts);
  EXPECT_TRUE(w.experts[0].fused() && w.has_shared && w.shared.fused());
  const int H = c.hidden_size, rows = 5;
  const std::vector<float> x = a.normals(size_t(rows) * H), y0 = a.normals(size_t(rows) * H);
  std::vector<float> want = y0, got = y0;
  MoeMlp(*be, c, separate, rows).forward(0, x.data(), want.data(), rows);
  MoeMlp(*be, c, fused, rows).forward(0, x.data(), got.data(), rows);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  int moved = 0;
  for (size_t i = 0; i < got.size(); ++i) moved += got[i] != y0[i];
  EXPECT_GT(moved, int(got.size()) / 2);  // the layer did add something
}

// ---- the tiny-moe preset end to end ----

std::vector<int32_t> generate(const std::string& preset, RunMode mode) {
  auto be = make_cpu_backend();
  const ModelConfig config = preset_config(preset);
  Model model(*be, config, Weights::synthetic(*be, config, 5), 16, 256);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  cc.num_pages = 6;
  KvCache cache(*be, cc);
  RunnerOptions ro;
  ro.mode = mode;
  ro.buckets = {1, 2, 4, 8, 16};
  Runner runner(model, cache, ro);
  return generate_greedy(runner, cache, model, byte_tokens("experts route tokens"), 12);
}

TEST(TinyMoe, KeepingTheFirstLayersCutsTheDenseCountWithThem) {
  const ModelConfig full = preset_config("tiny-moe");
  const ModelConfig one = keep_first_layers(full, 1);
  EXPECT_EQ(one.num_hidden_layers, 1);
  EXPECT_EQ(one.first_k_dense_replace, std::min(full.first_k_dense_replace, 1));
  EXPECT_FALSE(one.layer_is_moe(0));
  EXPECT_EQ(keep_first_layers(full, 0).num_hidden_layers, full.num_hidden_layers);
  EXPECT_EQ(keep_first_layers(full, 99).num_hidden_layers, full.num_hidden_layers);
  EXPECT_EQ(weight_manifest(one).size() < weight_manifest(full).size(), true);
  EXPECT_THROW(keep_first_layers(full, -1), Error);
}

TEST(TinyMoe, PresetHasOneDenseAndOneMoeLayer) {
  const ModelConfig c = preset_config("tiny-moe");
  EXPECT_FALSE(c.layer_is_moe(0));
  EXPECT_TRUE(c.layer_is_moe(1));
  std::set<std::string> names;
  for (const WeightSpec& s : weight_manifest(c)) names.insert(s.name);
  EXPECT_TRUE(names.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(names.count("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.shared_experts.up_proj.weight"));
  const auto presets = preset_names();
  EXPECT_NE(std::find(presets.begin(), presets.end(), "tiny-moe"), presets.end());
  try {
    preset_config("nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny-moe"), std::string::npos) << e.what();
  }
}

TEST(TinyMoe, GeneratesDeterministicallyInEagerAndGraphMode) {
  const auto eager = generate("tiny-moe", RunMode::kEager);
  EXPECT_EQ(eager.size(), 12u);
  EXPECT_EQ(generate("tiny-moe", RunMode::kEager), eager);
  EXPECT_EQ(generate("tiny-moe", RunMode::kGraph), eager);
  EXPECT_NE(generate("tiny", RunMode::kEager), eager);  // the MoE layer changes the model
}

}  // namespace
}  // namespace dsa
