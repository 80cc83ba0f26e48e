// The frame of dsa_gpu_bench: ceilings measured at start, a timer, and the result table.
//
// Each bench file defines one run_*_benches(BenchContext&) in namespace dsa::bench, times its
// kernels with ctx.time_us and reports rows with ctx.add. A row names its floor: the bytes it
// must move at the measured copy bandwidth, the flops at the measured bf16 rate, or an empty
// launch for tiny work. Inputs rotate over more than 3x L2 (kRotateBytes) so HBM is measured.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsa/backend.h"

namespace dsa::bench {

inline constexpr double kRotateBytes = 192.0 * 1024 * 1024;  // > 3x the H200's 60 MB L2

struct BenchResult {
  std::string name;     // "store_index_k/bf16/tokens=1048576"
  double us = 0;        // median time per call
  double bytes = 0;     // bytes the op must move (read + write), for GB/s
  double flops = 0;     // flops the op must do, 0 when memory bound
  double floor_us = 0;  // the best possible time: bytes / copy_gbs, flops / bf16 rate, or a launch
  std::string floor_kind;  // "hbm", "bf16", "launch"
  nlohmann::json extra;    // anything else worth keeping
};

class BenchContext {
 public:
  BenchContext(dsa::Backend& backend_ref, cudaStream_t stream_ref)
      : backend(backend_ref), stream(stream_ref) {}

  dsa::Backend& backend;
  cudaStream_t stream;
  double copy_gbs = 0;         // device-to-device copy, read + write bytes, GB/s (1e9)
  double empty_launch_us = 0;  // one empty kernel, graph-launched back to back (time_graph_us)
  double empty_stream_launch_us = 0;  // the same kernel launched on the stream one by one
  double bf16_tflops = 0;             // a large bf16 GEMM through cuBLASLt
  // Attention families to run (indexer_logits, topk, sparse_mla); empty: all of them.
  std::vector<std::string> attention_only;
  // The invariant GEMM kernels the GEMM benches time ("mma", "wgmma"); empty: both.
  std::vector<std::string> gemm_kernels;
  // Also time the former top-k and indexer kernels: rows topk_legacy/... and
  // indexer_logits_legacy/... (see run_attention_benches).
  bool legacy_rows = false;
  // Indexer kernel variants to time beside the default, each forced (DSA_CUDA_INDEXER_VARIANT):
  // rows indexer_logits_<variant>/...
  std::vector<std::string> indexer_variants;
  // Batch sizes of the indexer rows (1: L = 131072, others L = 32768); empty: 64 and 1.
  std::vector<int> indexer_rows;
  // Batch sizes of the sparse MLA rows (1, 64, 256); empty: all of them (e.g. one B under ncu).
  std::vector<int> sparse_mla_rows;
  // After the bf16 sparse MLA rows of each B, one traced launch of the warp-specialized kernel
  // (SparseMlaParams::trace): its CTAs' phases, in rows sparse_mla_trace/bf16/B=.../ws.
  bool mla_trace = false;

  // Median microseconds per call of fn (which enqueues on `stream`): warm-up, then several
  // repeats of `iters` calls between CUDA events.
  double time_us(const std::function<void()>& fn, int iters);
  // Median microseconds per call of fn when `calls` calls are captured into one CUDA graph and
  // the graph is launched back to back: no per-launch host overhead. The empty-kernel floor and
  // the small stores are both timed this way, so the floor is comparable with what it bounds.
  double time_graph_us(const std::function<void()>& fn, int calls);
  void add(BenchResult r);

  // Floors from the measured ceilings.
  double hbm_floor_us(double bytes) const { return bytes / (copy_gbs * 1e3); }
  double bf16_floor_us(double flops) const { return flops / (bf16_tflops * 1e6); }
  // How many input sets to rotate over so their total passes kRotateBytes (at least 1).
  static int rotation_sets(double bytes_per_set) {
    const int n = int(kRotateBytes / (bytes_per_set > 1 ? bytes_per_set : 1)) + 1;
    return n < 1 ? 1 : n;
  }

  const std::vector<BenchResult>& results() const { return results_; }
  // Seconds since the context was made (the sweep's budget counts from it).
  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::vector<BenchResult> results_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// An empty kernel on `stream` (empty_kernel.cu), for the launch floor.
cudaError_t launch_empty_kernel(cudaStream_t stream);

// The split combine's data movement alone (cluster_exchange.cu): clusters of 8 CTAs, each with a
// 64 x 512 f32 partial, each left with its 64-dim slice of the 8 partials' sum; mode 0 pulls the
// slices from the other CTAs' shared memory, 1 pushes them into their owners', 2 goes through
// global memory. The result is kept from the last of three launches (synchronized).
struct ClusterExchangeResult {
  double cta_us = 0;      // mean over CTAs of the exchange's span
  double cta_cycles = 0;  // the same in SM clocks
  double launch_us = 0;   // the launch's span (first start to last end, globaltimer)
  int ctas = 0, sms = 0;  // CTAs launched, distinct SMs used
};
cudaError_t run_cluster_exchange(int mode, int clusters, cudaStream_t stream,
                                 ClusterExchangeResult& out);

// Defined in bench_store.cpp.
void run_store_benches(BenchContext& ctx);
// Defined in bench_gemm.cpp.
void run_gemm_benches(BenchContext& ctx);
// The invariant GEMM's configurations on every projection and B (--gemm-sweep): new
// configurations stop once budget_s has passed; `only` names projections (empty: all).
struct GemmSweepOptions {
  double budget_s = 80;
  std::vector<std::string> only;
  std::string kernel = "mma";        // the invariant kernel whose tiles are swept: "mma" or "wgmma"
  bool default_splits_only = false;  // tiles only, at the table's split count (the bits it keeps)
};
void run_gemm_sweep(BenchContext& ctx, const GemmSweepOptions& options);  // bench_gemm_sweep.cpp
// Defined in bench_attention.cpp (a weak default in main.cpp prints that it was not built).
void run_attention_benches(BenchContext& ctx);

}  // namespace dsa::bench
