// Hopper's bulk tensor copy engine (TMA, plain sm_90) and the shared-memory barriers it completes
// on (mbarrier), for kernels that stream tiles into shared memory with one producer thread while
// the other warps compute. PTX ISA: "Tensor Copy Instructions" (cp.async.bulk.tensor) and
// "Parallel Synchronization and Communication Instructions: mbarrier".
//
// The pattern. A stage of shared memory has two barriers:
//   full[s]:  count 1. The producer arrives once with expect_tx(bytes) and issues the copies;
//             each copy completes `bytes` of transactions on the same barrier when its data has
//             landed, so the phase completes when the arrival and all the bytes are in.
//             Consumers wait on it; the data is then visible to them and to the async proxy
//             (wgmma) without any further fence.
//   empty[s]: count = the consumers (one arrival per consumer warpgroup, after its last read of
//             the stage has completed). The producer waits on it before reusing the stage.
// Phases alternate parity 0, 1, 0, ...: use r of a stage (r = tile / stages) waits full[s] with
// parity r & 1, and the producer's use r >= 1 waits empty[s] with parity (r - 1) & 1.
//
// The copy: a box of the tensor map (box {64 k, rows, 1} of bf16 here) at coordinates {k, row,
// batch} lands in shared memory as rows of 128 bytes with the 128-byte swizzle the map names,
// the layout wgmma.cuh describes (the destination 1024-aligned). Elements outside the tensor's
// extent are never read and land as +0, and they still count toward the transaction bytes: the
// full box's bytes complete on the barrier whatever the coordinates.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/mma.cuh"

namespace dsa::cuda {

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// Makes the initialized barriers visible to the async proxy (the copy engine) and the other
// threads; a __syncthreads follows it.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// Returns once the phase of parity `parity` has completed. kCluster: acquire at cluster scope,
// so that other CTAs' arrivals (mbar_arrive_remote) happen before what this thread does next.
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  uint32_t done = 0;
  do {
    if constexpr (kCluster) {
      asm volatile(
          "{\n"
          ".reg .pred p;\n"
          "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n"
          "}\n"
          : "=r"(done)
          : "r"(addr), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n"
          ".reg .pred p;\n"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n"
          "}\n"
          : "=r"(done)
          : "r"(addr), "r"(parity)
          : "memory");
    }
  } while (done == 0);
}

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The box of `map` at {c0, c1, c2} into shared memory at dst, completing on bar. `map` must be a
// __grid_constant__ kernel parameter (or otherwise in global or constant memory).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// The same box into every CTA of the cluster that cta_mask names (bit r: rank r), at dst's
// offset in each CTA's shared memory, completing its bytes on the barrier at bar's offset in each
// of them (sm_90a). Each destination's barrier must expect these bytes in the phase they land in;
// they may land before that CTA's own arrive.expect_tx (the phase cannot complete while the
// arrival is pending).
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const CUtensorMap* map, int c0,
                                                      int c1, int c2, uint64_t* bar,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)),
      "h"(cta_mask)
      : "memory");
}

// One arrival on the barrier at bar's offset in CTA `cta` of the cluster (release at cluster
// scope: this thread's earlier accesses happen before whatever the barrier's waiter does next).
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

// Warpgroup register budgets (sm_90a): the producer warpgroup gives registers back, the
// consumers take them. Each warpgroup's call is one branch of the role if/else.
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Host (tma.cu): the tensor map of a tensor [batch][rows][cols] (cols contiguous; row and batch
// strides in elements) read in boxes of box_cols x box_rows x 1:
//   kBf16Swizzle128: bf16, box_cols = 64 (128-byte rows), the 128-byte swizzle of wgmma.cuh;
//   kBytesPlain: one-byte elements (fp8 codes), box_cols * 1 a multiple of 16, no swizzle (the
//     box lands as rows of box_cols bytes, back to back);
//   kBytesSwizzle128: one-byte elements, box_cols = 128 (128-byte rows), the 128-byte swizzle
//     (e4m3 operands of wgmma in wgmma.cuh's K-major layout).
// False when the driver cannot encode it (an address or stride not 16-byte aligned, a box too
// large, no driver entry point): the caller then takes another path.
enum class TileMap { kBf16Swizzle128, kBytesPlain, kBytesSwizzle128 };
bool encode_tile_map(CUtensorMap* map, TileMap kind, const void* base, int64_t cols, int64_t rows,
                     int64_t batch, int64_t row_stride, int64_t batch_stride, int box_cols,
                     int box_rows);

}  // namespace dsa::cuda
