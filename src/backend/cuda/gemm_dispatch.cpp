#include "backend/cuda/gemm_dispatch.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.h"
#include "dsa/error.h"

namespace dsa::cuda {
namespace {

// A GEMM kernel the environment names: `var` = "mma" or "wgmma", else (unset or empty) `unset`.
// Any other value is refused, naming it.
GemmKernel gemm_kernel_env(const char* var, GemmKernel unset) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return unset;
  const std::string value(v);
  if (value == "mma") return GemmKernel::kMma;
  if (value == "wgmma") return GemmKernel::kWgmma;
  fail(ErrorCode::kInvalidArgument, "{} '{}' must be 'mma' or 'wgmma' (unset: '{}')", var, value,
       gemm_kernel_name(unset));
}

// The batch-invariant GEMM's kernel: DSA_CUDA_GEMM, else kDefaultGemmKernel.
GemmKernel gemm_kernel_from_env() { return gemm_kernel_env("DSA_CUDA_GEMM", kDefaultGemmKernel); }
// Which kernel runs fp8 weights under the wgmma kernel, as GemmInvariantTuning::fp8 (0 mma.sync,
// 1 wgmma): DSA_CUDA_GEMM_FP8, else mma.sync.
int gemm_fp8_from_env() {
  return gemm_kernel_env("DSA_CUDA_GEMM_FP8", GemmKernel::kMma) == GemmKernel::kWgmma;
}
// Which kernel runs kKN weights (kv_b's absorb) under the wgmma kernel, as
// GemmInvariantTuning::kn (0 mma.sync, 1 the wgmma bulk-copy tiles): DSA_CUDA_GEMM_KN, else the
// wgmma tiles (1.17-1.85x cuBLASLt's time on kv_b absorb against mma.sync's 1.36-2.23x on the
// H200, bench/results/2026-12-04-h200-kn-fp8r.md).
int gemm_kn_from_env() {
  return gemm_kernel_env("DSA_CUDA_GEMM_KN", GemmKernel::kWgmma) == GemmKernel::kWgmma;
}

// The wgmma fp8 tile the environment names (DSA_CUDA_GEMM_FP8_TILE, e.g. "fp8r.8x128.s6"), as
// GemmInvariantTuning::fp8_tile; unset or empty: -1 (the kernel picks per shape). An unknown name
// is refused, listing the tiles.
int gemm_fp8_tile_from_env() {
  const char* v = std::getenv("DSA_CUDA_GEMM_FP8_TILE");
  if (v == nullptr || *v == '\0') return -1;
  std::string names;
  for (int tile = 0; tile < gemm_invariant_fp8_tile_count(); ++tile) {
    if (gemm_invariant_fp8_tile_name(tile) == std::string_view(v)) return tile;
    names += fmt::format("{}{}", tile ? ", " : "", gemm_invariant_fp8_tile_name(tile));
  }
  fail(ErrorCode::kInvalidArgument, "DSA_CUDA_GEMM_FP8_TILE '{}' names no fp8 tile (the tiles: {})",
       v, names);
}

// The split-K reduction the environment asks for (DSA_CUDA_GEMM_REDUCE), as
// GemmInvariantTuning::reduce: auto (also unset or empty) -1, cluster 2, global 3 (env_knobs.cpp
// refuses other values when the backend is made).
int gemm_reduce_from_env() {
  const char* v = std::getenv("DSA_CUDA_GEMM_REDUCE");
  const std::string_view value = v == nullptr ? "" : v;
  return value == "cluster" ? 2 : value == "global" ? 3 : -1;
}

}  // namespace

GemmDispatch::GemmDispatch(int device, std::function<const std::string&()> label)
    : device_(device),
      label_(std::move(label)),
      kernel_(gemm_kernel_from_env()),
      fp8_(gemm_fp8_from_env()),
      fp8_tile_(gemm_fp8_tile_from_env()),
      kn_(gemm_kn_from_env()),
      reduce_(gemm_reduce_from_env()) {}

void GemmDispatch::release() {
  for (LaneScratch& s : scratch_) {
    if (s.x) cudaFree(s.x);
    if (s.partials) cudaFree(s.partials);
    s = {};
  }
  for (CublasLtGemm& c : cublas_) c.release();
}

void GemmDispatch::set_tuning(const GemmInvariantTuning& tuning) {
  const GemmKernel kernel = resolved(tuning).kernel;
  require(tuning.tile >= -1 && tuning.tile < gemm_invariant_tile_count(kernel),
          ErrorCode::kInvalidArgument, "gemm tuning: tile {} must be -1 or in [0, {}) ({})",
          tuning.tile, gemm_invariant_tile_count(kernel), gemm_kernel_name(kernel));
  require(tuning.splits >= 0, ErrorCode::kInvalidArgument, "gemm tuning: splits {} must be >= 0",
          tuning.splits);
  require(tuning.reduce >= -1 && tuning.reduce <= 3, ErrorCode::kInvalidArgument,
          "gemm tuning: reduce {} must be -1, 0, 1, 2 or 3", tuning.reduce);
  require(tuning.fp8 >= -1 && tuning.fp8 <= 1, ErrorCode::kInvalidArgument,
          "gemm tuning: fp8 {} must be -1, 0 or 1", tuning.fp8);
  require(tuning.fp8_tile >= -1 && tuning.fp8_tile < gemm_invariant_fp8_tile_count(),
          ErrorCode::kInvalidArgument, "gemm tuning: fp8_tile {} must be -1 or in [0, {})",
          tuning.fp8_tile, gemm_invariant_fp8_tile_count());
  tuning_ = tuning;
}

void GemmDispatch::create_cublas(int lane) { cublas_[lane].create(); }

void GemmDispatch::reserve(int lane, size_t x_elements, int max_rows, cudaStream_t stream) {
  const Queue q{lane, stream};
  x_scratch(x_elements, q);
  partials(gemm_invariant_scratch_floats_bound(max_rows), q);
}

void GemmDispatch::run(const GemmParams& p, GemmMode mode, int lane, cudaStream_t stream) {
  if (p.m > 0 && p.batch > 0) require_gemm_weight_operand(p);
  const Queue q{lane, stream};
  switch (mode) {
    case GemmMode::kExact:
      require(!p.x_fp8, ErrorCode::kInvalidArgument,
              "gemm: fp8 activations (--weights w8a8) run with --gemm invariant only; exact "
              "computes the CPU's bits of bf16 and fp8 weights");
      launched(gemm_exact(p, stream), "gemm_exact");
      return;
    case GemmMode::kBatchInvariant:
      invariant(p, q);
      return;
    case GemmMode::kFast:
      cublaslt(p, q);
      return;
  }
}

void GemmDispatch::invariant(const GemmParams& p, Queue q) {
  require(p.m >= 0 && p.n > 0 && p.k > 0 && p.batch >= 0, ErrorCode::kInvalidArgument,
          "gemm: m {} and batch {} must be >= 0, n {} and k {} > 0", p.m, p.batch, p.n, p.k);
  if (p.m == 0 || p.batch == 0) return;
  const GemmInvariantTuning tuning = resolved(tuning_);
  if (p.x_fp8) {
    w8a8(p, tuning, q);
    return;
  }
  const XBf16 xb = x_as_bf16(p, q, gemm_invariant_fp8_runs_wgmma(p, tuning));
  float* scratch = partials(gemm_invariant_scratch_floats(p, tuning), q);
  launched(gemm_invariant(p, xb.data, xb.ld, xb.batch_stride, scratch, tuning, q.stream),
           "gemm_invariant");
}

// fp8 activations: x as its producer quantized it (p.x8), else quantized into the x scratch
// (codes, then scales); then the e4m3 GEMM.
void GemmDispatch::w8a8(const GemmParams& p, const GemmInvariantTuning& tuning, Queue q) {
  require(gemm_invariant_w8a8_runs(p), ErrorCode::kInvalidArgument,
          "gemm: fp8 activations (--weights w8a8) need [n, k] fp8 weights of one batch entry, "
          "16-byte aligned, with k ({}) and the row stride ({}) multiples of 16",
          p.k, p.ld_w);
  Fp8Rows x8 = p.x8;
  if (x8.codes) {
    require(gemm_w8a8_reads(x8, p.m, p.k), ErrorCode::kInvalidArgument,
            "gemm: a given x8 needs 16-byte aligned codes with ld ({}) a multiple of 16 and "
            "8-byte aligned scales with ld_scales ({}) even",
            x8.ld, x8.ld_scales);
  } else {
    const size_t bytes = w8a8_x_bytes(p.m, p.k);
    x8 = w8a8_x_rows(x_scratch((bytes + sizeof(Bf16) - 1) / sizeof(Bf16), q), p.m, p.k);
    launched(quantize_fp8_rows(p.x, p.ld_x, p.m, p.k, x8, true, q.stream), "quantize_fp8_rows");
  }
  float* scratch = partials(gemm_invariant_scratch_floats(p, tuning), q);
  launched(gemm_w8a8(p, x8, scratch, tuning, q.stream), "gemm_w8a8");
}

void GemmDispatch::cublaslt(const GemmParams& p, Queue q) {
  require(p.m >= 0 && p.n > 0 && p.k > 0 && p.batch >= 0, ErrorCode::kInvalidArgument,
          "gemm: m {} and batch {} must be >= 0, n {} and k {} > 0", p.m, p.batch, p.n, p.k);
  if (p.m == 0 || p.batch == 0) return;
  // cuBLASLt's bf16 GEMM has no block-scaled fp8 operand of this kind; fp8 weights would need a
  // dequantized copy per call, which defeats them. Refused: they run with invariant or exact.
  require(p.w_fp8 == nullptr, ErrorCode::kInvalidArgument,
          "gemm: --gemm fast (cuBLASLt) takes bf16 weights only; fp8 weights (--weights fp8) "
          "run with --gemm invariant or exact");
  const XBf16 x = x_as_bf16(p, q);
  cublas_[q.lane].run(p, x.data, x.ld, x.batch_stride, q.stream, label_());
}

// x as bf16: the caller's copy when it gave one, else converted into scratch (dense, 16-byte
// aligned rows when k is a multiple of 8). `aligned`: the fp8 wgmma tiles will read it, which
// needs 16-byte rows; a caller's copy without them is converted too (the same bits).
GemmDispatch::XBf16 GemmDispatch::x_as_bf16(const GemmParams& p, Queue q, bool aligned) {
  const bool usable =
      !aligned || ((reinterpret_cast<uintptr_t>(p.x_bf16) & 15u) == 0 && p.ld_x_bf16 % 8 == 0);
  if (p.x_bf16 != nullptr && p.batch == 1 && usable) {
    require(p.ld_x_bf16 >= p.k, ErrorCode::kInvalidArgument, "gemm: ld_x_bf16 {} must be >= k {}",
            p.ld_x_bf16, p.k);
    return {p.x_bf16, p.ld_x_bf16, 0};
  }
  const int64_t xk = int64_t(p.m) * p.k;
  Bf16* scratch = x_scratch(size_t(xk) * p.batch, q);
  launched(convert_to_bf16(p.x, p.m, p.k, p.ld_x, p.batch, p.batch_stride_x, scratch, q.stream),
           "convert_to_bf16");
  return {scratch, p.k, xk};
}

// The tuning with its kernels named: the tuning's own, else the environment's (DSA_CUDA_GEMM,
// DSA_CUDA_GEMM_FP8, DSA_CUDA_GEMM_FP8_TILE, DSA_CUDA_GEMM_KN, DSA_CUDA_GEMM_REDUCE).
GemmInvariantTuning GemmDispatch::resolved(GemmInvariantTuning tuning) const {
  if (tuning.reduce < 0) tuning.reduce = reduce_;  // may stay -1: the default's choice
  if (tuning.kernel == GemmKernel::kDefault) tuning.kernel = kernel_;
  if (tuning.fp8 < 0) tuning.fp8 = fp8_;
  if (tuning.fp8_tile < 0) tuning.fp8_tile = fp8_tile_;
  if (tuning.kn < 0) tuning.kn = kn_;
  return tuning;
}

// The bf16 (or e4m3) copy of x.
Bf16* GemmDispatch::x_scratch(size_t elems, Queue q) {
  LaneScratch& s = scratch_[q.lane];
  return static_cast<Bf16*>(grown(s.x, s.x_bytes, elems * sizeof(Bf16), "bf16 x scratch", q));
}

// The split-K scratch of the invariant GEMM: its counters must start at zero, so a new buffer is
// cleared (outside capture, as every growth is).
float* GemmDispatch::partials(size_t floats, Queue q) {
  LaneScratch& s = scratch_[q.lane];
  const size_t before = s.partial_bytes;
  void* buffer = grown(s.partials, s.partial_bytes, floats * sizeof(float), "split-K partials", q);
  if (s.partial_bytes != before) {
    check(cudaMemsetAsync(buffer, 0, s.partial_bytes, q.stream),
          "cudaMemsetAsync(s.partials, 0, s.partial_bytes, q.stream)");
  }
  return static_cast<float*>(buffer);
}

// A device buffer of at least `bytes`, grown (never shrunk) outside capture only: a graph must
// never see a buffer move. `what` names it in the message.
void* GemmDispatch::grown(void*& buffer, size_t& capacity, size_t bytes, const char* what,
                          Queue q) {
  if (bytes <= capacity) return buffer;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(q.stream, &status), "cudaStreamIsCapturing(q.stream, &status)");
  require(status == cudaStreamCaptureStatusNone, ErrorCode::kInternal,
          "gemm on {} needs {} bytes of {} during graph capture but has {}; size it before "
          "capture (reserve_gemm_scratch, or one eager run of the step)",
          label_(), bytes, what, capacity);
  check(cudaStreamSynchronize(q.stream), "cudaStreamSynchronize(q.stream)");
  if (buffer) check(cudaFree(buffer), "cudaFree(buffer)");
  buffer = nullptr;
  capacity = 0;
  buffer = device_alloc(bytes, label_);
  capacity = bytes;
  return buffer;
}

void GemmDispatch::check(cudaError_t err, const char* statement, std::source_location loc) const {
  check_cuda(err, statement, device_, loc);
}

void GemmDispatch::launched(cudaError_t err, const char* op, std::source_location loc) const {
  check_launch(err, op, label_, loc);
}

}  // namespace dsa::cuda
