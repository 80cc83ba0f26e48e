// The CPU backend: host memory, the reference ops, and a "graph" that records the step closure
// and replays it over the same static buffers at the same fixed shape.
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "dsa/backend.h"
#include "dsa/error.h"

namespace dsa {
namespace {

class CpuGraph final : public Graph {
 public:
  explicit CpuGraph(std::function<void()> step) : step_(std::move(step)) {}
  void replay() override { step_(); }

 private:
  std::function<void()> step_;
};

class CpuBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string describe() const override { return "cpu (reference)"; }

  void* allocate(size_t bytes) override { return allocate_host(bytes); }
  void deallocate(void* p) override { deallocate_host(p); }
  void copy_to_device(void* dst, const void* src, size_t n) override { copy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, size_t n) override { copy(dst, src, n); }
  void copy_on_device(void* dst, const void* src, size_t n) override { copy(dst, src, n); }
  void fill(void* dst, uint8_t byte, size_t n) override {
    if (n) std::memset(dst, byte, n);
  }
  void synchronize() override {}

  std::unique_ptr<Graph> capture(const std::function<void()>& step) override {
    // Like stream capture, recording runs nothing: the first replay is the first execution.
    return std::make_unique<CpuGraph>(step);
  }

  void rmsnorm(const RmsNormParams& p) override { cpu::rmsnorm(p); }
  void layernorm(const LayerNormParams& p) override { cpu::layernorm(p); }
  void rope(const RopeParams& p) override { cpu::rope(p); }
  void hadamard(const HadamardParams& p) override { cpu::hadamard(p); }
  void gemm(const GemmParams& p) override { cpu::gemm(p); }
  void swiglu(const SwigluParams& p) override { cpu::swiglu(p); }
  void softmax(const SoftmaxParams& p) override { cpu::softmax(p); }
  void embed(const EmbedParams& p) override { cpu::embed(p); }
  void add(const AddParams& p) override { cpu::add(p); }
  void moe_route(const MoeRouteParams& p) override { cpu::moe_route(p); }
  void scale_rows(const ScaleRowsParams& p) override { cpu::scale_rows(p); }
  void store_index_k(const StoreIndexKParams& p) override { cpu::store_index_k(p); }
  void store_latent_kv(const StoreLatentKvParams& p) override { cpu::store_latent_kv(p); }
  void indexer_logits(const IndexerLogitsParams& p) override { cpu::indexer_logits(p); }
  // rope -> hadamard by the base class, then the fp8 encoding of the result when asked for.
  void indexer_query(const IndexerQueryParams& p) override {
    IndexerQueryParams plain = p;
    plain.q_fp8 = nullptr;
    plain.q_fp8_scale = nullptr;
    Backend::indexer_query(plain);
    if (p.q_fp8 != nullptr) cpu::encode_index_query(p);
  }
  void topk(const TopkParams& p) override { cpu::topk(p); }
  void sparse_mla(const SparseMlaParams& p) override { cpu::sparse_mla(p); }
  void audit_slots(const AuditSlotsParams& p) override { cpu::audit_slots(p); }
  void sample(const SampleParams& p) override { cpu::sample(p); }
  void digest_rows(const DigestRowsParams& p) override { cpu::digest_rows(p); }
  void audit_sample(const AuditSampleParams& p) override { cpu::audit_sample(p); }

 private:
  static void copy(void* dst, const void* src, size_t n) {
    if (n) std::memmove(dst, src, n);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace dsa
