// Kernel launchers of the CUDA backend, one per op, mirroring src/backend/cpu/cpu_ops.h.
// Each enqueues on `stream` and returns cudaGetLastError(); the host-side backend checks it.
// This header is shared by .cu and .cpp files, so it includes no fmt and no dsa/error.h.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/pdl.h"
#include "dsa/ops.h"

namespace dsa::cuda {

// The current device's SM count, asked of the driver once per device (0 when it cannot be read):
// launch shapes that follow it cost no driver call per launch.
inline int device_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device < kMaxDevices && known[device] > 0) return known[device];
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  if (device < kMaxDevices) known[device] = sms;
  return sms;
}

// The launch attribute that groups a grid's blocks in clusters of x by y by z.
inline cudaLaunchAttribute cluster_dimension(unsigned x, unsigned y = 1, unsigned z = 1) {
  cudaLaunchAttribute a;
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = x;
  a.val.clusterDim.y = y;
  a.val.clusterDim.z = z;
  return a;
}

// Runs set() (a cudaError_t) on the current device unless `done` (a bit per device, one flag per
// kernel) says it already ran there; force: run it again. For per-kernel attributes that must be
// set once per device before a launch (and before a graph capture).
template <typename Set>
cudaError_t once_per_device(std::atomic<uint64_t>& done, bool force, Set&& set) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = uint64_t(1) << (device % 64);
  if (!force && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  err = set();
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

// Above 48 KiB of dynamic shared memory a kernel must opt in, once per device.
inline cudaError_t opt_in_smem(const void* kernel, int bytes, bool force,
                               std::atomic<uint64_t>& opted_in) {
  return once_per_device(opted_in, force, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
}

cudaError_t rmsnorm(const RmsNormParams& p, cudaStream_t stream);      // norm.cu
cudaError_t layernorm(const LayerNormParams& p, cudaStream_t stream);  // norm.cu
cudaError_t rope(const RopeParams& p, cudaStream_t stream);            // rope.cu
cudaError_t hadamard(const HadamardParams& p, cudaStream_t stream);    // hadamard.cu
// GemmMode::kExact: plain f32, bit-identical to cpu/gemm.cpp (and batch-invariant).
cudaError_t gemm_exact(const GemmParams& p, cudaStream_t stream);  // gemm.cu
// GemmMode::kBatchInvariant (gemm_tensor.cu, gemm_wgmma.cu): tensor cores on bf16(x), a
// reduction order fixed by k, n and batch; tuning.kernel picks mma.sync or wgmma (kDefault:
// kDefaultGemmKernel; the backend resolves it from DSA_CUDA_GEMM first). x_bf16 is bf16(p.x),
// [batch][m, k] with row stride ld_xb and batch stride bs_xb (p.x itself is not read). scratch
// holds gemm_invariant_scratch_floats(p, tuning) floats (split-K counters, then partial sums); it
// must be zero when first allocated, and every launch leaves its counters zero again. tuning: see
// GemmInvariantTuning (cuda_backend.h).
cudaError_t gemm_invariant(const GemmParams& p, const Bf16* x_bf16, int64_t ld_xb, int64_t bs_xb,
                           float* scratch, const GemmInvariantTuning& tuning, cudaStream_t stream);
size_t gemm_invariant_scratch_floats(const GemmParams& p, const GemmInvariantTuning& tuning);
// fp8 activations (p.x_fp8, gemm_w8a8.cu): y from x8, x's codes and block scales (p.x8 as its
// producer wrote them, or what quantize_fp8_rows wrote for p's x; p.x itself is not read):
// codes 16-byte aligned with ld a multiple of 16, scales 8-byte aligned with ld_scales even and
// >= m (the scales of rows past m, up to ld_scales, are read but reach no output: initialize them
// once). The split plan, scratch and reduction are gemm_invariant's.
cudaError_t gemm_w8a8(const GemmParams& p, const Fp8Rows& x8, float* scratch,
                      const GemmInvariantTuning& tuning, cudaStream_t stream);
bool gemm_w8a8_reads(const Fp8Rows& x8, int m, int k);  // x8 meets those demands
// x [m, k] (row stride ld_x, k a multiple of 16) quantized into `out` (Fp8Rows, ops.h: codes
// 4-byte aligned with ld a multiple of 4): encode_fp8_group's bytes and scales (dsa/token_codec.h)
// of rows < m; with zero_pad (the GEMM's own scratch), scale 0 for the rows from m up to the next
// multiple of 8 that lie below ld_scales. A producer's rows past m are left as they are.
cudaError_t quantize_fp8_rows(const float* x, int64_t ld_x, int m, int k, const Fp8Rows& out,
                              bool zero_pad, cudaStream_t stream);
// The GEMM's own quantization of x: w8a8_x_bytes(m, k) bytes of scratch (16-byte aligned) carved
// into codes [m, k] and scales with ld_scales = m rounded up to 8.
size_t w8a8_x_bytes(int m, int k);
Fp8Rows w8a8_x_rows(void* scratch, int m, int k);
// Lets every tile configuration use its shared memory on the current device; gemm_invariant
// does it itself on first use, this does it ahead of a graph capture.
cudaError_t gemm_invariant_prepare();
// The most gemm_invariant_scratch_floats returns for any shape with m <= max_rows under the
// default tuning.
size_t gemm_invariant_scratch_floats_bound(int max_rows);
cudaError_t swiglu(const SwigluParams& p, cudaStream_t stream);    // elementwise.cu
cudaError_t softmax(const SoftmaxParams& p, cudaStream_t stream);  // elementwise.cu
cudaError_t embed(const EmbedParams& p, cudaStream_t stream);      // elementwise.cu
cudaError_t add(const AddParams& p, cudaStream_t stream);          // elementwise.cu

cudaError_t moe_route(const MoeRouteParams& p, cudaStream_t stream);    // moe.cu
cudaError_t scale_rows(const ScaleRowsParams& p, cudaStream_t stream);  // moe.cu

cudaError_t store_index_k(const StoreIndexKParams& p, cudaStream_t stream);      // store.cu
cudaError_t store_latent_kv(const StoreLatentKvParams& p, cudaStream_t stream);  // store.cu
cudaError_t indexer_key(const IndexerKeyParams& p, cudaStream_t stream);         // indexer_key.cu
cudaError_t indexer_query(const IndexerQueryParams& p, cudaStream_t stream);     // indexer_key.cu
cudaError_t latent_kv(const LatentKvParams& p, cudaStream_t stream);             // store.cu

cudaError_t indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream);  // indexer_logits.cu
cudaError_t topk(const TopkParams& p, cudaStream_t stream);                     // topk.cu
cudaError_t sparse_mla(const SparseMlaParams& p, cudaStream_t stream);          // sparse_mla.cu
// The wgmma kernel alone (sparse_mla() dispatches to it; p already checked there).
cudaError_t sparse_mla_wgmma(const SparseMlaParams& p, cudaStream_t stream);  // sparse_mla_wgmma.cu
// The 64-token, token-split wgmma kernel (sparse_mla_wgmma64.cu; DSA_CUDA_SPARSE_MLA_VARIANT=
// wgmma64): bf16 caches, an fp8 cache goes to sparse_mla_wgmma.
cudaError_t sparse_mla_wgmma64(const SparseMlaParams& p, cudaStream_t stream);
// The warp-specialized 64-token kernel (sparse_mla_ws.cu; DSA_CUDA_SPARSE_MLA_VARIANT=ws): the
// 64-token kernel's bits on bf16 caches; fp8 caches dequantized in its tiles (its own bits).
cudaError_t sparse_mla_ws(const SparseMlaParams& p, cudaStream_t stream);

cudaError_t audit_slots(const AuditSlotsParams& p, cudaStream_t stream);    // audit.cu
cudaError_t digest_rows(const DigestRowsParams& p, cudaStream_t stream);    // audit.cu
cudaError_t audit_sample(const AuditSampleParams& p, cudaStream_t stream);  // audit.cu

cudaError_t sample(const SampleParams& p, cudaStream_t stream);  // sample.cu
size_t sample_workspace_bytes(int rows, int vocab);              // sample.cu

}  // namespace dsa::cuda
