// The auditor's digest-and-compare as a kernel (the cache never leaves the device), and the
// digests of what a step's rows mean to write, mirroring src/backend/cpu/audit.cpp.
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "dsa/slot_digest.h"

namespace dsa::cuda {
namespace {

// Asks L2 for every 128-byte line of [p, p + bytes) at once, so the walk below waits on memory
// about once per token rather than once per line. Only for a small n (a sampled or listed verify,
// where one thread's latency is the kernel's time): with a million slots in flight the prefetched
// lines would outnumber L2 and evict each other, and the many threads hide the latency anyway.
constexpr int kPrefetchMaxSlots = 4096;

__device__ void prefetch_l2(const uint8_t* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
  }
}

// digest_words of one run, 16 bytes per load where the run allows (every pool token is 16-byte
// aligned and a multiple of 16 bytes long; the fp8 index-K scale, one word, is not): the same
// little-endian words in the same order, so the same digest as slot_digest.
__device__ uint64_t digest_run(uint64_t h, const uint8_t* p, int64_t bytes) {
  if ((reinterpret_cast<uintptr_t>(p) & 15) != 0 || bytes % 16 != 0) {
    return digest_words(h, p, bytes);
  }
  const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll 8
  for (int64_t i = 0; i < bytes / 16; ++i) {
    const uint4 q = v[i];
    h = digest_word(digest_word(digest_word(digest_word(h, q.x), q.y), q.z), q.w);
  }
  return h;
}

// One thread per slot: a digest walks one token's bytes (at most 1152) in order.
__global__ void audit_slots_kernel(AuditSlotsParams p) {
  pdl_enter();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const SlotBytes bytes = p.kind == PoolKind::kLatent ? latent_slot_bytes(p.pool, p.slots[i])
                                                      : index_k_slot_bytes(p.pool, p.slots[i]);
  if (p.n <= kPrefetchMaxSlots) prefetch_l2(bytes.first, bytes.first_len);
  uint64_t h = digest_run(kDigestSeed, bytes.first, bytes.first_len);
  if (bytes.second) h = digest_run(h, bytes.second, bytes.second_len);
  const uint64_t d = digest_final(h);
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
  pdl_enter();
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

// One thread per (pool, draw), pools outermost: draw i of every pool reads the same slot. Every
// block reads the step before it counts itself done, and the last block out advances next_step,
// so all blocks of a launch use one step and the next launch (or graph replay) the next one.
__global__ void audit_sample_kernel(AuditSampleParams p) {
  pdl_enter();
  AuditSampleRecord* f = p.findings;
  __shared__ int64_t step;
  if (threadIdx.x == 0)
    step = p.step >= 0 ? p.step : *reinterpret_cast<volatile int64_t*>(&f->next_step);
  __syncthreads();
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < int64_t(p.n_pools) * p.sample) {
    const int pool = int(t / p.sample);
    const int64_t i = t % p.sample, n = *p.live_count, count = p.sample;
    const bool every = count >= n;
    int64_t pos = i < n ? i : -1;
    if (!every) {
      pos = audit_sample_position(audit_sample_start(p.seed, step), i, n / count, n % count);
    }
    if (p.drawn && pool == 0) p.drawn[i] = pos;
    if (pos >= 0) {
      const AuditPool& a = p.pools[pool];
      const int64_t slot = p.live[pos];
      const SlotBytes bytes = a.kind == PoolKind::kLatent ? latent_slot_bytes(a.view, slot)
                                                          : index_k_slot_bytes(a.view, slot);
      if (count <= kPrefetchMaxSlots) prefetch_l2(bytes.first, bytes.first_len);
      uint64_t h = digest_run(kDigestSeed, bytes.first, bytes.first_len);
      if (bytes.second) h = digest_run(h, bytes.second, bytes.second_len);
      if (digest_final(h) != a.expected[pos]) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&f->mismatches), 1ull);
        const unsigned at = atomicAdd(&f->kept, 1u);
        if (at < unsigned(kSampledMismatchesKept)) f->first[at] = {slot, step, pool, 0};
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&f->done_blocks, 1u) == gridDim.x - 1) {
      f->done_blocks = 0;
      f->verifies += 1;
      f->next_step = step + 1;
      __threadfence();
    }
  }
}

}  // namespace

cudaError_t audit_sample(const AuditSampleParams& p, cudaStream_t stream) {
  if (p.sample <= 0 || p.n_pools <= 0) return cudaSuccess;
  if (!p.live || !p.live_count || !p.pools || !p.findings) return cudaErrorInvalidValue;
  constexpr int kThreads = 128;
  const int64_t threads = int64_t(p.n_pools) * p.sample;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  launch_kernel(audit_sample_kernel, unsigned(blocks), kThreads, 0, stream, p);
  return cudaGetLastError();
}

cudaError_t digest_rows(const DigestRowsParams& p, cudaStream_t stream) {
  if (p.rows < 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (!p.values || !p.n_real || !p.digests || (p.kind == PoolKind::kLatent && !p.k_rope)) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 64;
  launch_kernel(digest_rows_kernel, unsigned((p.rows + kThreads - 1) / kThreads), kThreads, 0,
                stream, p);
  return cudaGetLastError();
}

cudaError_t audit_slots(const AuditSlotsParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  constexpr int kThreads = 128;
  launch_kernel(audit_slots_kernel, (p.n + kThreads - 1) / kThreads, kThreads, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
