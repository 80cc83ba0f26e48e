// Warp-level primitives shared by the tensor-core kernels (PTX ISA): 16- and 4-byte cp.async copies
// into shared memory and their groups, ldmatrix, and mma.sync m16n8k16 on bf16 with f32
// accumulation. The copies, group boundaries and waits carry a "memory" clobber, so the compiler
// never moves a shared-memory access across them; ldmatrix and mma are ordered by the barriers
// around them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsa::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// 16 bytes from global memory to shared memory, through L2 only (.cg); 16-byte aligned both ends.
__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(global)
               : "memory");
}
// 4 bytes from global memory to shared memory (through L1: .ca, the only kind below 16 bytes);
// 4-byte aligned both ends.
__device__ __forceinline__ void cp_async4(void* smem, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(global)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8 x 8 b16 matrices: lane 8 i + r gives the shared address of row r of matrix i (16 bytes),
// and register i of lane 4 g + t receives row g, columns 2t and 2t + 1 of matrix i (the lower
// column in the low half). With .trans, columns and rows swap: rows 2t and 2t + 1 of column g.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) {
  ldmatrix_x4(r, smem_addr(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
  ldmatrix_x4_trans(r, smem_addr(row));
}

// d += a * b on one m16n8k16 fragment triple: a is 16 x 16 bf16 (row-major, 4 registers), b is
// 16 x 8 bf16 ("col", 2 registers), d is 16 x 8 f32 (4 registers); fragment layouts in the PTX
// ISA, "Matrix Fragments for mma.m16n8k16 with floating point type".
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace dsa::cuda
