// Per-op profiling for dsa bench-decode --profile: a backend that forwards everything to another
// and, while recording, brackets each op with stopwatch points and notes its shape, the bytes it
// must move and the FLOPs it must do (each input read once, each output written once).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsa/backend.h"

namespace dsa::tools {

struct OpCost {
  std::string op;     // "gemm"
  std::string shape;  // "m=1 n=1536 k=7168"
  double bytes = 0, flops = 0;
};

struct OpTiming {
  OpCost cost;
  double us = 0;
};

// The ceilings a floor is computed from: bytes / bandwidth or FLOPs / rate, whichever is larger.
// Both are measured on the device of the run (measure_ceilings) unless given (bench-decode's
// --peak-gbps and --peak-tflops); `source` says which, for the table and the JSON.
struct Ceilings {
  double gb_per_s = 0;     // device copy, read + write bytes per second / 1e9
  double tflop_per_s = 0;  // the backend's --gemm fast rate on a square bf16 GEMM
  std::string copy_source = "given", rate_source = "given";  // or "measured: ..." (how)
  double floor_us(const OpCost& c) const;
  // "copy 4254 GB/s (measured: ...), matrix 790 TFLOP/s (given)"
  std::string describe() const;
};

// The sizes measure_ceilings times: a device copy of copy_bytes (counted twice: read and write,
// as dsa_gpu_bench counts its copy) and an m = n = k = gemm_dim GEMM with bf16 operands, each
// the median of `iters` runs after one warm-up. ceiling_probe() gives dsa_gpu_bench's sizes on
// CUDA (1 GiB, 8192) and sizes a CPU finishes in about a second (64 MiB, 512).
struct CeilingProbe {
  size_t copy_bytes = 0;
  int gemm_dim = 0;
  int iters = 5;
};
CeilingProbe ceiling_probe(BackendKind kind);
// Fills in the ceilings that are 0 in `given` by timing them on `backend` (with its stopwatch,
// outside any profile: pass the unwrapped backend), and checks that the copy and the GEMM
// computed what they were asked to (kInternal otherwise). Its buffers are freed on return.
Ceilings measure_ceilings(Backend& backend, Ceilings given, const CeilingProbe& probe);

// Per-op medians over several recorded runs of the same op sequence.
std::vector<OpTiming> median_timings(const std::vector<std::vector<OpTiming>>& runs);
// The llm.c-style table: op, shape, us, % of the sum, MB, GFLOP, floor us, floor / actual, and
// the op's time over empty_us (an empty launch timed the same way; the column is left out when
// empty_us is 0).
std::string profile_table(const std::vector<OpTiming>& ops, const Ceilings& ceilings,
                          double empty_us = 0);
nlohmann::json profile_json(const std::vector<OpTiming>& ops, const Ceilings& ceilings,
                            double empty_us = 0);

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : inner_(inner), watch_(inner.stopwatch()) {
    set_gemm_mode(inner.gemm_mode());
  }

  void start();                    // records the ops queued from now on
  std::vector<OpTiming> finish();  // synchronizes; the ops since start() with their times
  // The median time of the smallest op there is, a 4-byte fill, bracketed by stopwatch points
  // exactly like every profiled op (n of them, one after another): the "empty launch" the
  // profile's small ops are compared with.
  double empty_launch_us(int n);
  Backend& inner() const { return inner_; }

  BackendKind kind() const override { return inner_.kind(); }
  std::string describe() const override { return inner_.describe(); }
  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* p) override { inner_.deallocate(p); }
  void* allocate_host(size_t bytes) override { return inner_.allocate_host(bytes); }
  void deallocate_host(void* p) override { inner_.deallocate_host(p); }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    inner_.copy_to_device(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    inner_.copy_to_host(dst, src, n);
  }
  void copy_on_device(void* dst, const void* src, size_t n) override {
    inner_.copy_on_device(dst, src, n);
  }
  void fill(void* dst, uint8_t byte, size_t n) override { inner_.fill(dst, byte, n); }
  void synchronize() override { inner_.synchronize(); }
  uint64_t memory_capacity_bytes() const override { return inner_.memory_capacity_bytes(); }
  std::unique_ptr<Stopwatch> stopwatch() override { return inner_.stopwatch(); }
  std::unique_ptr<Graph> capture(const std::function<void()>& step) override;
  // Forwarded only while not recording: a recorded step runs every op on the main lane, in
  // program order, so each op's stopwatch points bracket that op alone.
  void set_lane(Lane lane) override {
    Backend::set_lane(lane);
    if (!recording_) inner_.set_lane(lane);
  }
  void lane_wait(Lane waiter, Lane waited) override {
    Backend::lane_wait(waiter, waited);
    if (!recording_) inner_.lane_wait(waiter, waited);
  }
  void reserve_gemm_scratch(size_t x_elements, int max_rows) override {
    inner_.reserve_gemm_scratch(x_elements, max_rows);
  }
  size_t sample_workspace_bytes(int rows, int vocab) const override {
    return inner_.sample_workspace_bytes(rows, vocab);
  }

  void rmsnorm(const RmsNormParams& p) override;
  void layernorm(const LayerNormParams& p) override;
  void rope(const RopeParams& p) override;
  void hadamard(const HadamardParams& p) override;
  void gemm(const GemmParams& p) override;
  void swiglu(const SwigluParams& p) override;
  void softmax(const SoftmaxParams& p) override;
  void embed(const EmbedParams& p) override;
  void add(const AddParams& p) override;
  void copy_rows(const CopyRowsParams& p) override;
  void moe_route(const MoeRouteParams& p) override;
  void scale_rows(const ScaleRowsParams& p) override;
  void store_index_k(const StoreIndexKParams& p) override;
  void indexer_key(const IndexerKeyParams& p) override;
  void indexer_query(const IndexerQueryParams& p) override;
  void latent_kv(const LatentKvParams& p) override;
  void store_latent_kv(const StoreLatentKvParams& p) override;
  void indexer_logits(const IndexerLogitsParams& p) override;
  void topk(const TopkParams& p) override;
  void sparse_mla(const SparseMlaParams& p) override;
  void audit_slots(const AuditSlotsParams& p) override;
  void digest_rows(const DigestRowsParams& p) override;
  void audit_sample(const AuditSampleParams& p) override;
  void sample(const SampleParams& p) override;

 private:
  template <typename Launch>
  void timed(OpCost cost, Launch&& launch);

  struct Pending {
    OpCost cost;
    int begin, end;
  };
  Backend& inner_;
  std::unique_ptr<Stopwatch> watch_;
  bool recording_ = false;
  std::vector<Pending> ops_;
};

}  // namespace dsa::tools
