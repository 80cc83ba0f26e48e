// dsa_gpu_bench: the project's own GPU benchmarks. Measures the ceilings of this device in this
// run (copy bandwidth, an empty launch, the cuBLASLt bf16 rate), runs every bench family, and
// prints each row with its napkin math: bytes, GB/s, the share of the measured ceiling, and the
// ratio to the row's floor. --json writes the same rows for bench/gpu/report.py.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "bench_util.h"
#include "dsa/error.h"

namespace dsa::bench {

__attribute__((weak)) void run_attention_benches(BenchContext&) {
  std::puts("attention benches not built");
}

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(ErrorCode::kBackend, "{} failed: {}", what, cudaGetErrorString(err));
}
void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail(ErrorCode::kBackend, "{} failed: status {}", what, int(st));
}

// Device-to-device copy of 1 GiB; counts read + write bytes.
double measure_copy_gbs(BenchContext& ctx) {
  const size_t bytes = size_t(1) << 30;
  DeviceArray<uint8_t> src(ctx.backend, bytes), dst(ctx.backend, bytes);
  ctx.backend.fill(src.data(), 1, bytes);
  const double us = ctx.time_us(
      [&] {
        check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, ctx.stream),
              "cudaMemcpyAsync");
      },
      10);
  return 2.0 * double(bytes) / (us * 1e3);
}

double measure_empty_launch_us(BenchContext& ctx) {
  return ctx.time_graph_us([&] { check(launch_empty_kernel(ctx.stream), "launch_empty_kernel"); },
                           1000);
}

double measure_empty_stream_launch_us(BenchContext& ctx) {
  return ctx.time_us([&] { check(launch_empty_kernel(ctx.stream), "launch_empty_kernel"); }, 1000);
}

// An 8192^3 bf16 GEMM (f32 accumulate, bf16 out) through cuBLASLt: the tensor-core ceiling.
double measure_bf16_tflops(BenchContext& ctx) {
  const int n = 8192;
  const size_t elems = size_t(n) * n;
  DeviceArray<uint16_t> a(ctx.backend, elems), b(ctx.backend, elems), d(ctx.backend, elems);
  DeviceArray<uint8_t> workspace(ctx.backend, size_t(64) << 20);
  ctx.backend.fill(a.data(), 0x3c, elems * 2);  // small finite bf16 values
  ctx.backend.fill(b.data(), 0x3c, elems * 2);
  cublasLtHandle_t handle;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t layout;
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  check(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, n, n, n), "MatrixLayoutCreate");
  check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  const uint64_t ws = workspace.bytes();
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof(ws)),
        "PreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(handle, desc, layout, layout, layout, layout, pref, 1,
                                       &heuristic, &found),
        "AlgoGetHeuristic");
  double tflops = 0;
  if (found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    const double us = ctx.time_us(
        [&] {
          check(cublasLtMatmul(handle, desc, &alpha, a.data(), layout, b.data(), layout, &beta,
                               d.data(), layout, d.data(), layout, &heuristic.algo,
                               workspace.data(), ws, ctx.stream),
                "cublasLtMatmul");
        },
        5);
    tflops = 2.0 * n * double(n) * n / (us * 1e6);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(handle);
  return tflops;
}

void print_table(const BenchContext& ctx) {
  std::printf("\n%-44s %10s %10s %9s %7s %9s %7s %10s %6s  %s\n", "name", "us", "MB", "GB/s",
              "%copy", "TFLOP/s", "%bf16", "floor_us", "floor/us", "floor");
  for (const auto& r : ctx.results()) {
    const double gbs = r.bytes / (r.us * 1e3);
    const double tflops = r.flops / (r.us * 1e6);
    std::printf("%-44s %10.2f %10.2f %9.1f %6.1f%% %9.2f %6.1f%% %10.2f %6.2f  %s\n",
                r.name.c_str(), r.us, r.bytes / 1e6, gbs, 100.0 * gbs / ctx.copy_gbs, tflops,
                ctx.bf16_tflops > 0 ? 100.0 * tflops / ctx.bf16_tflops : 0.0, r.floor_us,
                r.us > 0 ? r.floor_us / r.us : 0.0, r.floor_kind.c_str());
  }
}

nlohmann::json to_json(const BenchContext& ctx) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : ctx.results()) {
    rows.push_back({{"name", r.name},
                    {"us", r.us},
                    {"bytes", r.bytes},
                    {"flops", r.flops},
                    {"gbs", r.bytes / (r.us * 1e3)},
                    {"pct_copy", 100.0 * r.bytes / (r.us * 1e3) / ctx.copy_gbs},
                    {"floor_us", r.floor_us},
                    {"floor_kind", r.floor_kind},
                    {"floor_ratio", r.us > 0 ? r.floor_us / r.us : 0.0},
                    {"extra", r.extra}});
  }
  return {{"device", ctx.backend.describe()},
          {"ceilings",
           {{"copy_gbs", ctx.copy_gbs},
            {"empty_launch_us", ctx.empty_launch_us},
            {"empty_stream_launch_us", ctx.empty_stream_launch_us},
            {"bf16_tflops", ctx.bf16_tflops}}},
          {"results", rows}};
}

}  // namespace

double BenchContext::time_us(const std::function<void()>& fn, int iters) {
  constexpr int kWarmup = 3, kRepeats = 7;
  for (int i = 0; i < kWarmup; ++i) fn();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> samples;
  for (int rep = 0; rep < kRepeats; ++rep) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) fn();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    samples.push_back(1e3 * double(ms) / iters);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  backend.synchronize();  // surfaces any fault of the timed work
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

double BenchContext::time_graph_us(const std::function<void()>& fn, int calls) {
  for (int i = 0; i < 3; ++i) fn();  // warm-up outside capture
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < calls; ++i) fn();
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  const double us =
      time_us([&] { check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); }, 5) / calls;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

void BenchContext::add(BenchResult r) {
  std::printf("  %-44s %10.2f us\n", r.name.c_str(), r.us);
  std::fflush(stdout);
  results_.push_back(std::move(r));
}

}  // namespace dsa::bench

int main(int argc, char** argv) {
  CLI::App app{
      "dsa_gpu_bench: dsa.cpp's GPU kernels against the ceilings measured in the same run"};
  std::string json_path;
  int device = 0;
  bool skip_attention = false, skip_store = false, skip_gemm = false;
  app.add_option("--json", json_path, "write the results as JSON to this file");
  app.add_option("--device", device, "CUDA device index");
  app.add_flag("--skip-store", skip_store, "do not run the store benches");
  app.add_flag("--skip-attention", skip_attention, "do not run the attention benches");
  app.add_flag("--skip-gemm", skip_gemm, "do not run the GEMM benches");
  std::vector<std::string> attention_only;
  app.add_option("--attention-only", attention_only,
                 "run only these attention families (indexer_logits, topk, sparse_mla)")
      ->check(CLI::IsMember({"indexer_logits", "topk", "sparse_mla"}))
      ->delimiter(',');
  bool legacy_rows = false;
  app.add_flag("--legacy", legacy_rows,
               "also time the former top-k kernel (DSA_CUDA_TOPK=legacy) and indexer kernel "
               "(DSA_CUDA_INDEXER_VARIANT=legacy): rows topk_legacy/... and "
               "indexer_logits_legacy/...");
  std::vector<std::string> indexer_variants;
  app.add_option("--indexer-variants", indexer_variants,
                 "also time these indexer kernel variants, each forced "
                 "(DSA_CUDA_INDEXER_VARIANT): rows indexer_logits_<variant>/...")
      ->check(
          CLI::IsMember({"legacy", "resident", "wgmma", "wgmma-n64", "wgmma-pipe", "wgmma-e4m3"}))
      ->delimiter(',');
  std::vector<int> indexer_rows;
  app.add_option("--indexer-rows", indexer_rows,
                 "batch sizes of the indexer rows (1: L = 131072, others L = 32768; default 64,1)")
      ->check(CLI::IsMember({1, 64, 256}))
      ->delimiter(',');
  std::vector<int> sparse_mla_rows;
  app.add_option("--sparse-mla-rows", sparse_mla_rows,
                 "run only these batch sizes of the sparse MLA rows (1, 64, 256)")
      ->check(CLI::IsMember({1, 64, 256}))
      ->delimiter(',');
  bool mla_trace = false;
  app.add_flag("--mla-trace", mla_trace,
               "after the bf16 sparse MLA rows of each B, one traced launch of the "
               "warp-specialized kernel (DSA_CUDA_SPARSE_MLA_VARIANT=ws) and of the heads-as-N "
               "one (=hn, at the default bound and at 8 splits): the mean time their CTAs "
               "spend in each phase (q's broadcast, first chunk, token loop, the combine's "
               "barrier, loads and exit), rows sparse_mla_trace/bf16/B=.../ws, .../hn and "
               ".../hn/splits=8; then the combine's "
               "data movement alone, pulled, pushed and through global memory, rows "
               "cluster_exchange/...");
  std::vector<std::string> gemm_kernels;
  app.add_option("--gemm-kernels", gemm_kernels,
                 "the invariant GEMM kernels the GEMM benches time (default: mma,wgmma)")
      ->check(CLI::IsMember({"mma", "wgmma"}))
      ->delimiter(',');
  bool gemm_sweep = false;
  dsa::bench::GemmSweepOptions sweep;
  app.add_flag("--gemm-sweep", gemm_sweep,
               "time every tile configuration and split count of the invariant GEMM per "
               "projection and B (instead of the GEMM benches), with a table to paste");
  app.add_option("--gemm-sweep-budget", sweep.budget_s,
                 "seconds after which the sweep tries no new configuration")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--gemm-sweep-only", sweep.only, "projections to sweep (q_a, o, lm_head, ...)");
  app.add_flag("--gemm-sweep-default-splits", sweep.default_splits_only,
               "sweep the tiles at each projection's table split count only (a tile never moves "
               "a bit; a split count does)");
  app.add_option("--gemm-sweep-kernel", sweep.kernel,
                 "the invariant GEMM kernel whose tiles are swept (kKN projections: mma)")
      ->check(CLI::IsMember({"mma", "wgmma"}));
  CLI11_PARSE(app, argc, argv);
  try {
    auto backend = dsa::make_cuda_backend(device);
    dsa::bench::BenchContext ctx(*backend, dsa::cuda_stream(*backend));
    ctx.attention_only = attention_only;
    ctx.legacy_rows = legacy_rows;
    ctx.sparse_mla_rows = sparse_mla_rows;
    ctx.mla_trace = mla_trace;
    ctx.indexer_variants = indexer_variants;
    ctx.indexer_rows = indexer_rows;
    ctx.gemm_kernels = gemm_kernels;
    std::printf("device: %s\n", backend->describe().c_str());
    ctx.copy_gbs = dsa::bench::measure_copy_gbs(ctx);
    ctx.empty_launch_us = dsa::bench::measure_empty_launch_us(ctx);
    ctx.empty_stream_launch_us = dsa::bench::measure_empty_stream_launch_us(ctx);
    ctx.bf16_tflops = dsa::bench::measure_bf16_tflops(ctx);
    std::printf(
        "ceilings: copy %.0f GB/s (read + write), empty launch %.2f us, bf16 %.0f TFLOP/s\n",
        ctx.copy_gbs, ctx.empty_launch_us, ctx.bf16_tflops);
    if (!skip_store) dsa::bench::run_store_benches(ctx);
    if (!skip_attention) dsa::bench::run_attention_benches(ctx);
    if (gemm_sweep) {
      dsa::bench::run_gemm_sweep(ctx, sweep);
    } else if (!skip_gemm) {
      dsa::bench::run_gemm_benches(ctx);
    }
    dsa::bench::print_table(ctx);
    if (!json_path.empty()) {
      std::ofstream(json_path) << dsa::bench::to_json(ctx).dump(2) << "\n";
      std::printf("wrote %s\n", json_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsa_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
