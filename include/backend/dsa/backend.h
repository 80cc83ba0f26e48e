// The backend interface: memory, the ops of ops.h, and graph capture. Callers (model, runner,
// tools) see only this; the CPU backend is the executable specification, CUDA must match it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "dsa/ops.h"

namespace dsa {

enum class BackendKind : uint8_t { kCpu, kCuda };

std::string_view backend_name(BackendKind kind);
BackendKind parse_backend(std::string_view name);  // "cpu" | "cuda"; throws on anything else

// GEMM algorithm choice. kBatchInvariant gives every row the same bits whatever the batch size
// (the deterministic mode); kFast may use a vendor library whose reduction order depends on m.
enum class GemmMode : uint8_t { kBatchInvariant, kFast };

// A recorded step, replayed over the same buffers it was captured with.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string describe() const = 0;  // device name, for logs and reports

  // ---- memory (all in this backend's address space) ----
  virtual void* allocate(size_t bytes) = 0;  // 256-byte aligned; throws kResourceExhausted
  virtual void deallocate(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(void* dst, uint8_t byte, size_t bytes) = 0;
  virtual void synchronize() = 0;  // wait for all queued work; surfaces asynchronous errors

  // ---- graphs ----
  // Runs `step` once under capture and returns a graph that re-runs it. Every pointer the step
  // uses must stay valid and unmoved for the graph's lifetime.
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& step) = 0;

  // ---- ops (ops.h) ----
  virtual void rmsnorm(const RmsNormParams& p) = 0;
  virtual void layernorm(const LayerNormParams& p) = 0;
  virtual void rope(const RopeParams& p) = 0;
  virtual void hadamard(const HadamardParams& p) = 0;
  virtual void gemm(const GemmParams& p) = 0;
  virtual void swiglu(const SwigluParams& p) = 0;
  virtual void softmax(const SoftmaxParams& p) = 0;
  virtual void embed(const EmbedParams& p) = 0;
  virtual void add(const AddParams& p) = 0;
  // Default: one copy_on_device per row. Backends override with a strided copy.
  virtual void copy_rows(const CopyRowsParams& p);

  // MoE routing and per-row scaling. Defaults throw kBackend (not implemented by the backend).
  virtual void moe_route(const MoeRouteParams& p);
  virtual void scale_rows(const ScaleRowsParams& p);

  virtual void store_index_k(const StoreIndexKParams& p) = 0;
  virtual void store_latent_kv(const StoreLatentKvParams& p) = 0;

  virtual void indexer_logits(const IndexerLogitsParams& p) = 0;
  virtual void topk(const TopkParams& p) = 0;
  virtual void sparse_mla(const SparseMlaParams& p) = 0;

  virtual void audit_slots(const AuditSlotsParams& p) = 0;
  virtual void digest_rows(const DigestRowsParams& p) = 0;

  // Sizes any gemm scratch for x of up to `x_elements` (batch * m * k) now, so no step captured
  // later needs to grow it. A no-op where gemm needs no scratch.
  virtual void reserve_gemm_scratch(size_t x_elements) {}

  GemmMode gemm_mode() const { return gemm_mode_; }
  void set_gemm_mode(GemmMode mode) { gemm_mode_ = mode; }

 protected:
  GemmMode gemm_mode_ = GemmMode::kBatchInvariant;
};

std::unique_ptr<Backend> make_cpu_backend();
// Throws kBackend when dsa.cpp was built without CUDA or no device is present.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// A CUDA backend that enqueues every op on a stream the caller owns (a framework's current stream,
// as its integer cudaStream_t handle; 0 is the legacy default stream), so the ops run in order with
// the caller's work and are captured with it into the caller's CUDA graph. It creates no stream and
// synchronizes nothing on destruction; it switches the thread to `device` and switches it back on
// destruction. Cheap enough to make per call (bindings do). Throws kBackend as make_cuda_backend.
std::unique_ptr<Backend> make_cuda_backend_on_stream(int device, uintptr_t stream);
bool cuda_available();  // built with CUDA and a device is present

std::unique_ptr<Backend> make_backend(BackendKind kind);

// ---- owning memory --------------------------------------------------------------------------

// A typed allocation in a backend's memory. Move-only; frees on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Backend& backend, size_t count)
      : backend_(&backend),
        data_(static_cast<T*>(backend.allocate(count ? count * sizeof(T) : 1))),
        count_(count) {}
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      data_ = o.data_;
      count_ = o.count_;
      o.backend_ = nullptr;
      o.data_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { reset(); }

  void reset() {
    if (backend_ && data_) backend_->deallocate(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace dsa
