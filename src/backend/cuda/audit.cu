// The auditor's digest-and-compare as a kernel: the cache never leaves the device.
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

}  // namespace

cudaError_t audit_slots(const AuditSlotsParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  constexpr int kThreads = 128;
  audit_slots_kernel<<<(p.n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
