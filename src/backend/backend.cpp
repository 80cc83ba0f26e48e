#include "dsa/backend.h"

#include <chrono>
#include <cstdlib>
#include <vector>

#include "dsa/error.h"
#include "dsa/file_io.h"

namespace dsa {

std::string_view backend_name(BackendKind kind) {
  return kind == BackendKind::kCpu ? "cpu" : "cuda";
}

BackendKind parse_backend(std::string_view name) {
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") return BackendKind::kCuda;
  fail(ErrorCode::kInvalidArgument, "unknown backend '{}' (expected cpu or cuda)", name);
}

std::string_view gemm_mode_name(GemmMode mode) {
  switch (mode) {
    case GemmMode::kExact:
      return "exact";
    case GemmMode::kBatchInvariant:
      return "invariant";
    case GemmMode::kFast:
      return "fast";
  }
  return "?";
}

GemmMode parse_gemm_mode(std::string_view name) {
  if (name == "exact") return GemmMode::kExact;
  if (name == "invariant") return GemmMode::kBatchInvariant;
  if (name == "fast") return GemmMode::kFast;
  fail(ErrorCode::kInvalidArgument, "unknown gemm mode '{}' (expected exact, invariant or fast)",
       name);
}

void require_fp8_rows(const char* op, const Fp8Rows& rows_of, int rows, int cols) {
  require(rows_of.codes && rows_of.scales && rows_of.ld >= cols && rows_of.ld_scales >= rows,
          ErrorCode::kInvalidArgument,
          "{}: fp8 rows need codes and scales, ld {} >= {} columns and ld_scales {} >= {} rows", op,
          rows_of.ld, cols, rows_of.ld_scales, rows);
}

void require_gemm_weight_operand(const GemmParams& p) {
  require((p.w != nullptr) != (p.w_fp8 != nullptr), ErrorCode::kInvalidArgument,
          "gemm: exactly one of w (bf16) and w_fp8 (fp8 e4m3) must be set; got {}",
          p.w ? "both" : "neither");
  require(!p.x_fp8 || p.w_fp8, ErrorCode::kInvalidArgument,
          "gemm: fp8 activations (x_fp8) multiply fp8 weights (w_fp8) only");
  require(!p.x8.codes || p.x_fp8, ErrorCode::kInvalidArgument,
          "gemm: a quantized x (x8) is read only with fp8 activations (x_fp8)");
  if (p.x8.codes) require_fp8_rows("gemm: x8", p.x8, p.m, p.k);
  if (!p.w_fp8) return;
  require(p.w_scale != nullptr, ErrorCode::kInvalidArgument,
          "gemm: fp8 weights (w_fp8) need their 128 x 128 block scales (w_scale)");
  require(p.layout == WeightLayout::kNK, ErrorCode::kInvalidArgument,
          "gemm: fp8 weights (w_fp8) must be [n, k] (WeightLayout::kNK); kKN takes bf16 only");
  require(p.batch == 1, ErrorCode::kInvalidArgument,
          "gemm: fp8 weights (w_fp8) take batch 1, not {}", p.batch);
  const int64_t k_blocks = (int64_t(p.k) + kGemmFp8Block - 1) / kGemmFp8Block;
  require(p.ld_w_scale >= k_blocks, ErrorCode::kInvalidArgument,
          "gemm: ld_w_scale {} is shorter than the {} scale blocks of k {}", p.ld_w_scale, k_blocks,
          p.k);
}

void* Backend::allocate_host(size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded ? rounded : 256);
  require(p != nullptr, ErrorCode::kResourceExhausted, "host allocation of {} bytes failed", bytes);
  return p;
}

void Backend::deallocate_host(void* p) { std::free(p); }

namespace {

class HostStopwatch final : public Stopwatch {
 public:
  int mark() override {
    points_.push_back(std::chrono::steady_clock::now());
    return int(points_.size()) - 1;
  }
  double elapsed_us(int from, int to) override {
    return std::chrono::duration<double, std::micro>(points_.at(size_t(to)) -
                                                     points_.at(size_t(from)))
        .count();
  }
  void reset() override { points_.clear(); }

 private:
  std::vector<std::chrono::steady_clock::time_point> points_;
};

class ReachedFence final : public Fence {
 public:
  bool reached() override { return true; }
  void wait() override {}
};

}  // namespace

std::unique_ptr<Stopwatch> Backend::stopwatch() { return std::make_unique<HostStopwatch>(); }

std::unique_ptr<Fence> Backend::fence() {
  synchronize();
  return std::make_unique<ReachedFence>();
}

void Backend::copy_to_host_async(void* host_dst, const void* src, size_t bytes) {
  copy_to_host(host_dst, src, bytes);
}

namespace {
void require_lane(Backend::Lane lane, const char* what) {
  require(lane == Backend::Lane::kMain || lane == Backend::Lane::kSide, ErrorCode::kInvalidArgument,
          "{}: lane {} is neither main (0) nor side (1)", what, int(lane));
}
}  // namespace

void Backend::set_lane(Lane lane) { require_lane(lane, "set_lane"); }

void Backend::lane_wait(Lane waiter, Lane waited) {
  require_lane(waiter, "lane_wait");
  require_lane(waited, "lane_wait");
}

void Backend::copy_rows(const CopyRowsParams& p) {
  for (int r = 0; r < p.rows; ++r) {
    copy_on_device(p.y + r * p.ld_y, p.x + r * p.ld_x, size_t(p.dim) * sizeof(float));
  }
}

uint64_t Backend::memory_capacity_bytes() const { return host_memory_bytes(); }

void Backend::indexer_key(const IndexerKeyParams& p) {
  const IndexerKeyParts parts = indexer_key_parts(p);
  layernorm(parts.norm);
  rope(parts.rope);
  hadamard(parts.hadamard);
  store_index_k(parts.store);
}

void Backend::latent_kv(const LatentKvParams& p) {
  const LatentKvParts parts = latent_kv_parts(p);
  rmsnorm(parts.norm);
  rope(parts.rope);
  store_latent_kv(parts.store);
}

void Backend::indexer_query(const IndexerQueryParams& p) {
  require(p.ld_q >= int64_t(p.heads) * kIndexHeadDim, ErrorCode::kInvalidArgument,
          "indexer_query: ld_q {} must be >= heads {} * {}", p.ld_q, p.heads, kIndexHeadDim);
  require(p.q_fp8 == nullptr, ErrorCode::kBackend,
          "indexer_query: backend {} does not write the fp8 encoding (q_fp8)", describe());
  const IndexerQueryParts parts = indexer_query_parts(p);
  rope(parts.rope);
  if (p.ld_q == int64_t(p.heads) * kIndexHeadDim) {
    hadamard(parts.hadamard);
    return;
  }
  for (int r = 0; r < p.rows; ++r) {  // the heads of one row at a time
    HadamardParams h = parts.hadamard;
    h.x = p.q + r * p.ld_q;
    hadamard(h);
  }
}

void Backend::moe_route(const MoeRouteParams&) {
  fail(ErrorCode::kBackend, "moe_route is not implemented by backend {}", describe());
}

void Backend::scale_rows(const ScaleRowsParams&) {
  fail(ErrorCode::kBackend, "scale_rows is not implemented by backend {}", describe());
}

std::unique_ptr<Backend> make_backend(BackendKind kind) {
  return kind == BackendKind::kCpu ? make_cpu_backend() : make_cuda_backend();
}

#if !defined(DSA_HAVE_CUDA)
bool cuda_available() { return false; }
std::unique_ptr<Backend> make_cuda_backend(int) {
  fail(ErrorCode::kBackend, "this build of dsa has no CUDA backend (configure with DSA_CUDA=ON)");
}
std::unique_ptr<Backend> make_cuda_backend_on_stream(int device, uintptr_t) {
  return make_cuda_backend(device);
}
int cuda_current_device() { return -1; }
#endif

}  // namespace dsa
