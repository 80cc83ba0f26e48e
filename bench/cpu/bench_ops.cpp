// CPU reference ops at the tiny model's sizes (hidden 256, ranks 128-512): GEMM in both weight
// layouts, RMSNorm and LayerNorm. Bytes are what one call must touch at least (weights once,
// activations in and out); items are multiply-adds for GEMM and elements for the norms.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace dsa {
namespace {

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<Bf16> random_bf16s(size_t n, uint64_t seed) {
  std::vector<Bf16> v;
  for (float x : random_floats(n, seed)) v.push_back(float_to_bf16(x * 0.05f));
  return v;
}

// Args: m (rows: the decode batch), n, k.
template <WeightLayout kLayout>
void BM_Gemm(benchmark::State& state) {
  const int m = int(state.range(0)), n = int(state.range(1)), k = int(state.range(2));
  const auto x = random_floats(size_t(m) * k, 1);
  const auto w = random_bf16s(size_t(n) * k, 2);
  std::vector<float> y(size_t(m) * n);
  GemmParams p;
  p.x = x.data(), p.w = w.data(), p.y = y.data();
  p.m = m, p.n = n, p.k = k;
  p.ld_x = k, p.ld_y = n, p.ld_w = kLayout == WeightLayout::kNK ? k : n;
  p.layout = kLayout;
  for (auto _ : state) {
    cpu::gemm(p);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const int64_t bytes = int64_t(n) * k * 2 + int64_t(m) * (k + n) * 4;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetItemsProcessed(state.iterations() * int64_t(m) * n * k);
}

void GemmShapes(benchmark::internal::Benchmark* b) {
  for (int m : {1, 8, 32}) {
    b->Args({m, 512, 256});  // hidden -> rank / q projections
    b->Args({m, 256, 512});  // rank -> hidden
    b->Args({m, 128, 256});
  }
}

BENCHMARK(BM_Gemm<WeightLayout::kNK>)->Apply(GemmShapes);
BENCHMARK(BM_Gemm<WeightLayout::kKN>)->Apply(GemmShapes);

// Args: rows, dim. Arg kind: 0 RMSNorm, 1 LayerNorm with bias.
void BM_Norm(benchmark::State& state) {
  const int rows = int(state.range(0)), dim = int(state.range(1));
  const bool layer = state.range(2) == 1;
  const auto x = random_floats(size_t(rows) * dim, 3);
  const auto weight = random_bf16s(size_t(dim), 4), bias = random_bf16s(size_t(dim), 5);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    if (layer) {
      cpu::layernorm({.x = x.data(),
                      .y = y.data(),
                      .weight = weight.data(),
                      .bias = bias.data(),
                      .rows = rows,
                      .dim = dim,
                      .ld_x = dim,
                      .ld_y = dim});
    } else {
      cpu::rmsnorm({.x = x.data(),
                    .y = y.data(),
                    .weight = weight.data(),
                    .rows = rows,
                    .dim = dim,
                    .ld_x = dim,
                    .ld_y = dim});
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (int64_t(rows) * dim * 8 + int64_t(dim) * 4));
  state.SetItemsProcessed(state.iterations() * int64_t(rows) * dim);
  state.SetLabel(layer ? "layernorm" : "rmsnorm");
}

BENCHMARK(BM_Norm)->ArgsProduct({{1, 32}, {128, 256, 512}, {0, 1}});

}  // namespace
}  // namespace dsa
