// The CUDA backend: device memory, the main lane's stream and the side lane's, the kernels of
// launch.h, the GEMM of gemm_dispatch.h (its modes, knobs and per-lane scratch), and stream
// capture into CUDA graphs.
//
// Every CUDA call goes through check(), which names the statement, the file:line and the device;
// every launcher's cudaError_t is checked right after the launch. Asynchronous faults surface at
// synchronize() as a dsa::Error naming the device.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/env_knobs.h"
#include "backend/cuda/gemm_dispatch.h"
#include "backend/cuda/launch.h"
#include "dsa/error.h"

namespace dsa {
namespace {

using cuda::check_cuda;

std::string device_label(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return fmt::format("cuda:{}", device);
  return fmt::format("cuda:{} ({})", device, prop.name);
}

class CudaGraph final : public Graph {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, int device)
      : graph_(graph), exec_(exec), stream_(stream), device_(device) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void replay() override {
    check_cuda(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch", device_);
  }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  int device_;
};

// A pool of events reused across resets: mark() records the next one on the stream.
class CudaStopwatch final : public Stopwatch {
 public:
  CudaStopwatch(cudaStream_t stream, int device) : stream_(stream), device_(device) {}
  ~CudaStopwatch() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  int mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreate(&e), "cudaEventCreate(&e)", device_);
      events_.push_back(e);
    }
    check_cuda(cudaEventRecord(events_[used_], stream_), "cudaEventRecord", device_);
    return int(used_++);
  }
  double elapsed_us(int from, int to) override {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events_.at(size_t(from)), events_.at(size_t(to))),
               "cudaEventElapsedTime", device_);
    return 1000.0 * ms;
  }
  void reset() override { used_ = 0; }

 private:
  cudaStream_t stream_;
  int device_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

// An event recorded on the stream; destroyed with the fence (an event needs no current device).
class CudaFence final : public Fence {
 public:
  CudaFence(cudaStream_t stream, int device) : device_(device) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)", device_);
    check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord(event_, stream)", device_);
  }
  ~CudaFence() override { cudaEventDestroy(event_); }
  bool reached() override {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    check_cuda(err, "cudaEventQuery(event_)", device_);
    return true;
  }
  void wait() override {
    check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize", device_);
  }

 private:
  cudaEvent_t event_ = nullptr;
  int device_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device)
      : device_(device),
        label_(device_label(device)),
        gemm_(device, [this]() -> const std::string& { return label(); }),
        lanes_(cuda::lanes_enabled()) {
    cuda::check_env_knobs();  // before any CUDA state: a bad knob leaves nothing to clean up
    check(cudaSetDevice(device_), "cudaSetDevice(device)");
    check(cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking)");
    stream_ = main_;
    owns_stream_ = true;
    gemm_.create_cublas(0);
  }
  // On a stream the caller owns: nothing is created up front (cuBLAS only when the fast gemm asks
  // for it), nothing is synchronized on destruction (the caller may be capturing the stream), and
  // the thread's current device is given back as it was found.
  CudaBackend(int device, cudaStream_t caller_stream)
      : device_(device),
        main_(caller_stream),
        stream_(caller_stream),
        gemm_(device, [this]() -> const std::string& { return label(); }),
        lanes_(cuda::lanes_enabled()) {
    cuda::check_env_knobs();
    check(cudaGetDevice(&caller_device_), "cudaGetDevice(&caller_device_)");
    if (caller_device_ != device_) check(cudaSetDevice(device_), "cudaSetDevice(device)");
  }
  ~CudaBackend() override {
    if (owns_stream_) cudaStreamSynchronize(main_);
    if (side_) cudaStreamSynchronize(side_);
    gemm_.release();
    for (cudaEvent_t e : lane_points_) {
      if (e) cudaEventDestroy(e);
    }
    if (side_) cudaStreamDestroy(side_);
    if (owns_stream_) cudaStreamDestroy(main_);
    if (caller_device_ >= 0 && caller_device_ != device_) cudaSetDevice(caller_device_);
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  // The device, and the kernel knobs this process set (env_knobs_set), so a report that names the
  // backend says which kernels ran: "cuda:0 (NVIDIA H200) [DSA_CUDA_PDL=on]".
  std::string describe() const override {
    const std::string knobs = cuda::env_knobs_set();
    return knobs.empty() ? label() : label() + " [" + knobs + "]";
  }
  cudaStream_t stream() const { return main_; }
  // The invariant GEMM's knobs (set_gemm_invariant_tuning in cuda_backend.h).
  void set_gemm_tuning(const cuda::GemmInvariantTuning& tuning) { gemm_.set_tuning(tuning); }

  // ---- memory ----
  void* allocate(size_t bytes) override {
    return cuda::device_alloc(bytes, [this]() -> const std::string& { return label(); });
  }
  void deallocate(void* p) override { check(cudaFree(p), "cudaFree(p)"); }
  void* allocate_host(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes ? bytes : 256, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorCode::kResourceExhausted, "cudaHostAlloc of {} pinned bytes failed on {}: {}",
           bytes, label(), cudaGetErrorString(err));
    }
    return p;
  }
  void deallocate_host(void* p) override { check(cudaFreeHost(p), "cudaFreeHost(p)"); }
  uint64_t memory_capacity_bytes() const override {
    size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo(&free_bytes, &total_bytes)");
    return total_bytes;
  }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    if (n)
      check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_)");
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    if (n)
      check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_)");
    synchronize();
  }
  void copy_to_host_async(void* dst, const void* src, size_t n) override {
    if (n)
      check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_)");
  }
  void copy_on_device(void* dst, const void* src, size_t n) override {
    if (n)
      check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_)");
  }
  void fill(void* dst, uint8_t byte, size_t n) override {
    if (n) check(cudaMemsetAsync(dst, byte, n, stream_), "cudaMemsetAsync(dst, byte, n, stream_)");
  }
  void synchronize() override {
    on_main("synchronize");
    cudaError_t err = side_ ? cudaStreamSynchronize(side_) : cudaSuccess;
    if (err == cudaSuccess) err = cudaStreamSynchronize(main_);
    if (err != cudaSuccess) {
      fail(ErrorCode::kBackend, "an asynchronous error on {}: {} ({}); a kernel faulted", label(),
           cudaGetErrorString(err), cudaGetErrorName(err));
    }
  }

  std::unique_ptr<Stopwatch> stopwatch() override {
    on_main("stopwatch");
    return std::make_unique<CudaStopwatch>(main_, device_);
  }
  std::unique_ptr<Fence> fence() override {
    on_main("fence");
    return std::make_unique<CudaFence>(main_, device_);
  }

  // ---- graphs ----
  // The side lane's work joins the capture through its first wait on the main lane and must be
  // joined back (lane_wait(kMain, kSide)) before the step returns, else the capture is refused.
  std::unique_ptr<Graph> capture(const std::function<void()>& step) override {
    on_main("capture");
    if (lanes_) side_stream();  // made before capture: nothing is created inside it
    check(cudaStreamBeginCapture(main_, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture(main_, cudaStreamCaptureModeThreadLocal)");
    cudaGraph_t graph = nullptr;
    try {
      step();
      on_main("the end of a captured step");
    } catch (const std::exception& e) {
      set_lane(Lane::kMain);
      cudaStreamEndCapture(main_, &graph);  // ends the capture; the partial graph is dropped
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      fail(ErrorCode::kBackend, "graph capture on {} failed inside the step: {}", label(),
           e.what());
    }
    const cudaError_t end = cudaStreamEndCapture(main_, &graph);
    if (end != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      fail(ErrorCode::kBackend,
           "graph capture on {} was invalidated: {} ({}); a step must only enqueue work on the "
           "backend's lanes, join its side lane back into the main one, and must not "
           "synchronize or allocate",
           label(), cudaGetErrorString(end), cudaGetErrorName(end));
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    if (inst != cudaSuccess) {
      cudaGraphDestroy(graph);
      check(inst, "cudaGraphInstantiate(&exec, graph, 0)");
    }
    return std::make_unique<CudaGraph>(graph, exec, main_, device_);
  }

  // ---- lanes ----
  // kSide runs on a second stream of the device, made on first use; lane_wait records the waited
  // lane's point (one event per lane, re-recorded at every wait) and makes the waiter's stream
  // wait for it. With DSA_CUDA_LANES=off both lanes are the main stream: program order.
  void set_lane(Lane lane) override {
    Backend::set_lane(lane);
    lane_ = lane;
    stream_ = lanes_ ? lane_stream(lane) : main_;
  }
  void lane_wait(Lane waiter, Lane waited) override {
    Backend::lane_wait(waiter, waited);
    if (!lanes_ || waiter == waited) return;
    cudaStream_t from = lane_stream(waited), to = lane_stream(waiter);
    cudaEvent_t& point = lane_points_[int(waited)];
    if (!point) {
      check(cudaEventCreateWithFlags(&point, cudaEventDisableTiming),
            "cudaEventCreateWithFlags(&point, cudaEventDisableTiming)");
    }
    check(cudaEventRecord(point, from), "cudaEventRecord(point, from)");
    check(cudaStreamWaitEvent(to, point, 0), "cudaStreamWaitEvent(to, point, 0)");
  }

  // ---- ops ----
  void rmsnorm(const RmsNormParams& p) override {
    if (p.y_fp8.codes) require_fp8_out("rmsnorm", p.y_fp8, p.rows, p.dim);
    launched(cuda::rmsnorm(p, stream_), "rmsnorm");
  }
  void layernorm(const LayerNormParams& p) override {
    launched(cuda::layernorm(p, stream_), "layernorm");
  }
  void rope(const RopeParams& p) override { launched(cuda::rope(p, stream_), "rope"); }
  void hadamard(const HadamardParams& p) override {
    launched(cuda::hadamard(p, stream_), "hadamard");
  }
  // On the current lane's stream, with the lane's own scratch (gemm_dispatch.h).
  void gemm(const GemmParams& p) override { gemm_.run(p, gemm_mode(), lane_index(), stream_); }
  void swiglu(const SwigluParams& p) override {
    if (p.out_fp8.codes) require_fp8_out("swiglu", p.out_fp8, p.rows, p.inter);
    launched(cuda::swiglu(p, stream_), "swiglu");
  }
  void softmax(const SoftmaxParams& p) override { launched(cuda::softmax(p, stream_), "softmax"); }
  void embed(const EmbedParams& p) override { launched(cuda::embed(p, stream_), "embed"); }
  void add(const AddParams& p) override { launched(cuda::add(p, stream_), "add"); }
  void moe_route(const MoeRouteParams& p) override {
    launched(cuda::moe_route(p, stream_), "moe_route");
  }
  void scale_rows(const ScaleRowsParams& p) override {
    launched(cuda::scale_rows(p, stream_), "scale_rows");
  }
  void store_index_k(const StoreIndexKParams& p) override {
    launched(cuda::store_index_k(p, stream_), "store_index_k");
  }
  void store_latent_kv(const StoreLatentKvParams& p) override {
    launched(cuda::store_latent_kv(p, stream_), "store_latent_kv");
  }
  void indexer_key(const IndexerKeyParams& p) override {
    launched(cuda::indexer_key(p, stream_), "indexer_key");
  }
  void indexer_query(const IndexerQueryParams& p) override {
    launched(cuda::indexer_query(p, stream_), "indexer_query");
  }
  void latent_kv(const LatentKvParams& p) override {
    launched(cuda::latent_kv(p, stream_), "latent_kv");
  }
  // The default fp8 kernel (wgmma-e4m3) under DSA_CUDA_INDEXER_Q=given.
  bool reads_fp8_index_query() const override { return cuda::indexer_reads_given_query(); }
  void indexer_logits(const IndexerLogitsParams& p) override {
    launched(cuda::indexer_logits(p, stream_), "indexer_logits");
  }
  void topk(const TopkParams& p) override { launched(cuda::topk(p, stream_), "topk"); }
  void sparse_mla(const SparseMlaParams& p) override {
    launched(cuda::sparse_mla(p, stream_), "sparse_mla");
  }
  // Both lanes' scratch when lanes are on (a GEMM on the side lane may run beside one on the
  // main lane, so they never share it), and the side's cuBLASLt handle where the main one exists.
  void reserve_gemm_scratch(size_t x_elements, int max_rows) override {
    gemm_.reserve(0, x_elements, max_rows, main_);
    if (lanes_) gemm_.reserve(1, x_elements, max_rows, side_stream());
    if (lanes_ && owns_stream_) gemm_.create_cublas(1);
    check(cuda::gemm_invariant_prepare(), "gemm_invariant_prepare()");
  }
  void audit_slots(const AuditSlotsParams& p) override {
    launched(cuda::audit_slots(p, stream_), "audit_slots");
  }
  void sample(const SampleParams& p) override { launched(cuda::sample(p, stream_), "sample"); }
  size_t sample_workspace_bytes(int rows, int vocab) const override {
    return cuda::sample_workspace_bytes(rows, vocab);
  }
  void digest_rows(const DigestRowsParams& p) override {
    launched(cuda::digest_rows(p, stream_), "digest_rows");
  }
  void audit_sample(const AuditSampleParams& p) override {
    launched(cuda::audit_sample(p, stream_), "audit_sample");
  }
  void copy_rows(const CopyRowsParams& p) override {
    if (p.rows <= 0 || p.dim <= 0) return;
    check(cudaMemcpy2DAsync(p.y, size_t(p.ld_y) * sizeof(float), p.x,
                            size_t(p.ld_x) * sizeof(float), size_t(p.dim) * sizeof(float),
                            size_t(p.rows), cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpy2DAsync(copy_rows)");
  }

 private:
  void check(cudaError_t err, const char* statement,
             std::source_location loc = std::source_location::current()) const {
    check_cuda(err, statement, device_, loc);
  }
  // The check after every launcher (cuda_check.h): names the op and the device.
  void launched(cudaError_t err, const char* op,
                std::source_location loc = std::source_location::current()) const {
    cuda::check_launch(
        err, op, [this]() -> const std::string& { return label(); }, loc);
  }

  // A producer's fp8 rows (ops.h, Fp8Rows), as the quantizer writes them.
  // The shared demands (require_fp8_rows), then the quantizer's: whole 16-column groups and
  // 4-byte aligned rows of codes.
  static void require_fp8_out(const char* op, const Fp8Rows& out, int rows, int cols) {
    require_fp8_rows(op, out, rows, cols);
    require(cols % 16 == 0 && out.ld % 4 == 0 && (reinterpret_cast<uintptr_t>(out.codes) & 3u) == 0,
            ErrorCode::kInvalidArgument,
            "{}: fp8 rows need {} columns a multiple of 16 and 4-byte aligned codes with ld ({}) a "
            "multiple of 4",
            op, cols, out.ld);
  }

  // The device's name, asked for only when a message or a report needs it.
  const std::string& label() const {
    if (label_.empty()) label_ = device_label(device_);
    return label_;
  }

  // Refuses a call that belongs to the main lane while the side one is current.
  void on_main(const char* what) const {
    require(lane_ == Lane::kMain, ErrorCode::kInternal,
            "{} on {} with the side lane current: set_lane(kMain) first", what, label());
  }
  cudaStream_t side_stream() {
    if (!side_) {
      check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking)");
    }
    return side_;
  }
  cudaStream_t lane_stream(Lane lane) { return lane == Lane::kSide ? side_stream() : main_; }
  // The index of the current lane's scratch and cuBLASLt handle: the main lane's when the lanes
  // share the main stream (DSA_CUDA_LANES=off).
  int lane_index() const { return lanes_ ? int(lane_) : 0; }

  int device_;
  mutable std::string label_;
  cudaStream_t main_ = nullptr;    // the backend's stream: the main lane, graphs, copies
  cudaStream_t stream_ = nullptr;  // the current lane's stream, where the ops queue
  cudaStream_t side_ = nullptr;    // the side lane's stream (made on first use)
  Lane lane_ = Lane::kMain;
  cudaEvent_t lane_points_[2] = {};  // each lane's point for lane_wait
  bool owns_stream_ = false;
  int caller_device_ = -1;   // the thread's device before a caller-stream backend switched it
  cuda::GemmDispatch gemm_;  // the GEMM's paths, knobs and per-lane scratch
  bool lanes_;               // DSA_CUDA_LANES (env_knobs.h): the side lane on its own stream
};

}  // namespace

cudaStream_t cuda_stream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  require(cuda != nullptr, ErrorCode::kInvalidArgument,
          "cuda_stream: backend '{}' is not a CUDA backend", backend.describe());
  return cuda->stream();
}

void set_gemm_invariant_tuning(Backend& backend, const cuda::GemmInvariantTuning& tuning) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  require(cuda != nullptr, ErrorCode::kInvalidArgument,
          "set_gemm_invariant_tuning: backend '{}' is not a CUDA backend", backend.describe());
  cuda->set_gemm_tuning(tuning);
}

bool cuda_available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);  // no driver: an error, never an abort
  if (err != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

namespace {
void require_device(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorCode::kBackend, "no CUDA device: cudaGetDeviceCount says {} ({})",
         cudaGetErrorString(err), cudaGetErrorName(err));
  }
  require(device >= 0 && device < count, ErrorCode::kBackend,
          "CUDA device {} does not exist: {} device(s) present", device, count);
}
}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  require_device(device);
  return std::make_unique<CudaBackend>(device);
}

std::unique_ptr<Backend> make_cuda_backend_on_stream(int device, uintptr_t stream) {
  require_device(device);
  return std::make_unique<CudaBackend>(device, reinterpret_cast<cudaStream_t>(stream));
}

int cuda_current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

}  // namespace dsa
