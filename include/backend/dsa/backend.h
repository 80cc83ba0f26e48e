// The backend interface: memory, the ops of ops.h, and graph capture. Callers (model, runner,
// tools) see only this; the CPU backend is the executable specification, CUDA must match it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "dsa/ops.h"

namespace dsa {

enum class BackendKind : uint8_t { kCpu, kCuda };

// The CUDA sparse MLA kernels' bound on splits per row: the variable they read and the values it
// takes (unset: 4). The split count moves the bits, so it is one value per process (the CUDA
// backend refuses any other value when it is made; the dsa commands' --mla-splits sets it).
inline constexpr std::string_view kSparseMlaSplitsVar = "DSA_CUDA_SPARSE_MLA_MAX_SPLITS";
inline constexpr std::array<std::string_view, 5> kSparseMlaSplitBounds = {"1", "2", "4", "8", "16"};
// The CUDA sparse MLA kernel family: the variable the dispatch reads and the families it takes
// (unset: ws). Each family sums in its own order, so it is one value per process too (the CUDA
// backend refuses any other value when it is made; the dsa commands' --mla-kernel sets it).
inline constexpr std::string_view kSparseMlaKernelVar = "DSA_CUDA_SPARSE_MLA_VARIANT";
inline constexpr std::array<std::string_view, 5> kSparseMlaKernels = {"ws", "hn", "wgmma64",
                                                                      "wgmma", "mma"};

std::string_view backend_name(BackendKind kind);
BackendKind parse_backend(std::string_view name);  // "cpu" | "cuda"; throws on anything else

// GEMM algorithm choice (the CPU backend always computes the reference, whatever the mode):
//   kExact:          f32 x, f32 sequential sum: bit-identical to the CPU reference, and
//                    batch-invariant; slow (CUDA cores).
//   kBatchInvariant: x rounded to bf16, tensor cores, a reduction order fixed by k, n and batch:
//                    every row gets the same bits whatever the batch size or its place in the
//                    batch; equal to the CPU reference within a stated bound, not bit for bit.
//                    The default.
//   kFast:           cuBLASLt; its reduction order depends on m, so it is not batch-invariant.
// fp8 weights (GemmParams::w_fp8): the CPU, kExact and kBatchInvariant (its mma.sync kernel;
// DSA_CUDA_GEMM=wgmma falls back to it for them) read them as ops.h defines; kFast refuses them.
enum class GemmMode : uint8_t { kExact, kBatchInvariant, kFast };
std::string_view gemm_mode_name(GemmMode mode);   // "exact" | "invariant" | "fast"
GemmMode parse_gemm_mode(std::string_view name);  // throws kInvalidArgument on anything else

// The weight operand of a GemmParams, checked the same way by every backend (kInvalidArgument,
// naming the problem): exactly one of w and w_fp8; with w_fp8 a w_scale, layout kNK, batch 1 and
// ld_w_scale >= ceil(k / 128). Shapes and strides are the backends' own checks.
void require_gemm_weight_operand(const GemmParams& p);
// Fp8Rows (ops.h) that `op` reads or writes for `rows` rows of `cols` values: codes and scales set,
// ld >= cols, ld_scales >= rows; throws kInvalidArgument naming op otherwise.
void require_fp8_rows(const char* op, const Fp8Rows& rows_of, int rows, int cols);

// A point in a backend's queued work that the host can ask about without waiting.
class Fence {
 public:
  virtual ~Fence() = default;
  virtual bool reached() = 0;  // all work queued before the fence is done; never waits
  virtual void wait() = 0;     // surfaces asynchronous errors
};

// A recorded step, replayed over the same buffers it was captured with.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void replay() = 0;
};

// Points in the order of a backend's work, for per-op timing (dsa bench-decode --profile).
class Stopwatch {
 public:
  virtual ~Stopwatch() = default;
  virtual int mark() = 0;  // a point after all work queued so far; returns its index
  // Microseconds of work between two points; call after Backend::synchronize().
  virtual double elapsed_us(int from, int to) = 0;
  virtual void reset() = 0;  // forget every point; indices start at 0 again
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string describe() const = 0;  // device name, for logs and reports

  // ---- memory (all in this backend's address space) ----
  virtual void* allocate(size_t bytes) = 0;  // 256-byte aligned; throws kResourceExhausted
  virtual void deallocate(void* p) = 0;
  // Host memory that copies to and from the device run from asynchronously (pinned on CUDA).
  virtual void* allocate_host(size_t bytes);  // 256-byte aligned; throws kResourceExhausted
  virtual void deallocate_host(void* p);
  // Queued on the backend's stream: returns at once when host_src came from allocate_host, and
  // host_src must then stay unchanged until the next synchronize().
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;  // synchronizes
  // Queued on the backend's stream, no wait: host_dst must come from allocate_host and may be read
  // once a fence() made after the copy is reached. Default: copy_to_host.
  virtual void copy_to_host_async(void* host_dst, const void* src, size_t bytes);
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(void* dst, uint8_t byte, size_t bytes) = 0;
  virtual void synchronize() = 0;  // wait for all queued work; surfaces asynchronous errors
  // The memory this backend allocates from, for estimates made before allocating: the host's
  // physical memory by default, the device's total on a GPU.
  virtual uint64_t memory_capacity_bytes() const;

  // CUDA events on the backend's stream; host clock readings on the CPU (ops are synchronous).
  virtual std::unique_ptr<Stopwatch> stopwatch();
  // A fence after all work queued so far on the backend's stream. Default: synchronize(), then a
  // fence already reached (right for backends whose ops are done when they return).
  virtual std::unique_ptr<Fence> fence();

  // ---- graphs ----
  // Runs `step` once under capture and returns a graph that re-runs it. Every pointer the step
  // uses must stay valid and unmoved for the graph's lifetime.
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& step) = 0;

  // ---- lanes: independent work inside one step ----
  // Ops queue on the current lane (kMain unless set_lane says otherwise), each after the ops
  // queued before it on the same lane. Work on different lanes is ordered only by lane_wait, so a
  // backend may run it concurrently: CUDA runs kSide on a second stream (joined into a captured
  // graph as a parallel branch); the CPU, whose ops are done when they return, runs everything in
  // program order, which is always a valid order. The values never depend on the interleaving as
  // long as no op on one lane touches memory that an op on the other writes while both are
  // unordered: the caller's promise (tests/unit/test_lanes.cpp checks the model's under the
  // extreme orders). Memory operations, synchronize(), fence(), stopwatch() and capture() belong
  // to kMain: call them with kMain current and with the side joined (lane_wait(kMain, kSide)).
  // Defaults: set_lane and lane_wait check their arguments and do nothing else.
  enum class Lane : uint8_t { kMain, kSide };
  virtual void set_lane(Lane lane);
  // Ops queued on `waiter` from now on run after every op queued on `waited` so far.
  virtual void lane_wait(Lane waiter, Lane waited);

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
  // The indexer's key path (ops.h). Default: the four ops of indexer_key_parts, in order, on this
  // backend (the CPU reference); CUDA runs them as one kernel.
  virtual void indexer_key(const IndexerKeyParams& p);
  // The latent path (rmsnorm -> rope -> store_latent_kv) and the indexer's query path (rope ->
  // hadamard), ops.h. Default: their ops in order on this backend; CUDA runs each as one kernel.
  virtual void latent_kv(const LatentKvParams& p);
  virtual void indexer_query(const IndexerQueryParams& p);

  virtual void indexer_logits(const IndexerLogitsParams& p) = 0;
  // Whether indexer_logits on an fp8 cache reads the query's encoding it is given
  // (IndexerLogitsParams::q_fp8) instead of encoding q itself. The model asks indexer_query for
  // the encoding only then, so no step writes bytes nobody reads. Default: no.
  virtual bool reads_fp8_index_query() const { return false; }
  virtual void topk(const TopkParams& p) = 0;
  virtual void sparse_mla(const SparseMlaParams& p) = 0;

  virtual void audit_slots(const AuditSlotsParams& p) = 0;
  virtual void digest_rows(const DigestRowsParams& p) = 0;
  virtual void audit_sample(const AuditSampleParams& p) = 0;

  virtual void sample(const SampleParams& p) = 0;
  // The workspace sample() needs for `rows` rows of `vocab` logits (0 where it needs none). It must
  // be zero when first allocated (fill it once); sample() leaves it fit for the next call, with
  // any rows <= `rows`.
  virtual size_t sample_workspace_bytes(int rows, int vocab) const { return 0; }

  // Sizes any gemm scratch for x of up to `x_elements` (batch * m * k) and m of up to
  // `max_rows` now, so no step captured later needs to grow it. A no-op where gemm needs none.
  virtual void reserve_gemm_scratch(size_t x_elements, int max_rows) {}

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
// The calling thread's current CUDA device, or -1 without CUDA (or when it cannot be read). A
// backend from make_cuda_backend_on_stream made while its device is current switches no device, so
// a binding may keep it and reuse it for as long as that device is current.
int cuda_current_device();

std::unique_ptr<Backend> make_backend(BackendKind kind);

// ---- owning memory --------------------------------------------------------------------------

enum class MemoryKind : uint8_t {
  kDevice,  // Backend::allocate
  kHost,    // Backend::allocate_host: host memory the backend copies from asynchronously
};

// A typed allocation in a backend's memory. Move-only; frees on destruction.
template <typename T, MemoryKind kKind = MemoryKind::kDevice>
class BackendArray {
 public:
  BackendArray() = default;
  BackendArray(Backend& backend, size_t count)
      : backend_(&backend),
        data_(static_cast<T*>(kKind == MemoryKind::kDevice
                                  ? backend.allocate(count ? count * sizeof(T) : 1)
                                  : backend.allocate_host(count ? count * sizeof(T) : 1))),
        count_(count) {}
  BackendArray(BackendArray&& o) noexcept { *this = std::move(o); }
  BackendArray& operator=(BackendArray&& o) noexcept {
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
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;
  ~BackendArray() { reset(); }

  void reset() {
    if (backend_ && data_) {
      kKind == MemoryKind::kDevice ? backend_->deallocate(data_) : backend_->deallocate_host(data_);
    }
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

template <typename T>
using DeviceArray = BackendArray<T, MemoryKind::kDevice>;
template <typename T>
using HostArray = BackendArray<T, MemoryKind::kHost>;  // pinned on CUDA

}  // namespace dsa
