// The auditor's digest-and-compare as a kernel (the cache never leaves the device), and the
// digests of what a step's rows mean to write, mirroring src/backend/cpu/audit.cpp.
#include "backend/cuda/launch.h"
#include "dsa/slot_digest.h"

namespace dsa::cuda {
namespace {

// One thread per slot: a digest walks one token's bytes (at most 1152) in order.
__global__ void audit_slots_kernel(AuditSlotsParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const SlotBytes bytes = p.kind == PoolKind::kLatent ? latent_slot_bytes(p.pool, p.slots[i])
                                                      : index_k_slot_bytes(p.pool, p.slots[i]);
  const uint64_t d = slot_digest(bytes);
  p.digests[i] = d;
  if (p.expected) {
    const bool bad = d != p.expected[i];
    p.flags[i] = bad;
    if (bad) atomicAdd(p.mismatches, 1);
  }
}

// One thread per row: the writers' encoder into a token-sized local buffer, then the digest, as
// in cpu::digest_rows. A step has at most a few hundred rows; this is not a hot path.
__global__ void digest_rows_kernel(DigestRowsParams p) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= p.rows) return;
  if (r >= *p.n_real) {
    p.digests[r] = 0;
    return;
  }
  const float* v = p.values + r * p.ld_values;
  p.digests[r] = p.kind == PoolKind::kIndexK
                     ? index_k_values_digest(p.dtype, p.rounding, v)
                     : latent_values_digest(p.dtype, p.rounding, v, p.k_rope + r * p.ld_rope);
}

}  // namespace

cudaError_t digest_rows(const DigestRowsParams& p, cudaStream_t stream) {
  if (p.rows < 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (!p.values || !p.n_real || !p.digests || (p.kind == PoolKind::kLatent && !p.k_rope)) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 64;
  digest_rows_kernel<<<unsigned((p.rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t audit_slots(const AuditSlotsParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  constexpr int kThreads = 128;
  audit_slots_kernel<<<(p.n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
