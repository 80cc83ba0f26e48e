// Hopper warpgroup MMA (wgmma, sm_90a) primitives: shared-memory matrix descriptors for the
// 128-byte-swizzled K-major layout, the ordering instructions (wgmma.fence, commit_group,
// wait_group, the generic-to-async proxy fence), and wgmma.mma_async m64nNk16 with bf16 inputs
// and f32 accumulation for N in {8, 16, 32, 64, 128} (both operands in shared memory, K-major),
// and its register-A form for N = 64 with B MN-major (wgmma_bf16_rs_mn). PTX ISA, "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Instructions".
//
// What one instruction computes. A warpgroup (4 consecutive warps, 128 threads, the first warp's
// index a multiple of 4) runs D = A * B + D, A 64 x 16 (M x K) and B 16 x N (K x N) in shared
// memory, D 64 x N f32 in registers, N/2 registers a thread. Both operands here are K-major (each
// row of A and each column of B has its 16 k values contiguous; imm-trans-a = imm-trans-b = 0).
//
// D fragment (m64nNk16, f32; the mma.sync m16n8 C layout repeated): thread t of the warpgroup,
// warp w = t / 32 (within the warpgroup), lane = 4 g + q (g in [0, 8), q in [0, 4)), holds, for
// each 8-column block j in [0, N/8),
//   d[4j + 0] = D[16 w + g][8 j + 2 q]        d[4j + 1] = D[16 w + g][8 j + 2 q + 1]
//   d[4j + 2] = D[16 w + g + 8][8 j + 2 q]    d[4j + 3] = D[16 w + g + 8][8 j + 2 q + 1]
//
// Shared-memory layout: 128-byte swizzle, K-major (the layout the bulk tensor copy engine writes
// with CU_TENSOR_MAP_SWIZZLE_128B, and the one cp.async writes below by hand).
//   - A tile of R rows (R a multiple of 8) x 64 bf16 of k: row r takes the 128 bytes at r * 128.
//     The 8 rows [8 a, 8 a + 8) form a 1024-byte "swizzle atom"; the tile starts 1024-aligned,
//     so atom a starts at a * 1024.
//   - Within row r, k values [8 c, 8 c + 8) (16-byte chunk c, c in [0, 8)) are stored at chunk
//     position c ^ (r % 8): byte r * 128 + ((c ^ (r % 8)) << 4). In address terms the hardware
//     XORs address bits [4, 7) with bits [7, 10), which is why atoms must be 1024-aligned.
//   - The wgmma for k16 block kk (k [16 kk, 16 kk + 16), kk in [0, 4)) of rows [0, 64) (A) or
//     [0, N) (B) uses the descriptor of the tile start plus kk * 32 bytes: the hardware applies
//     the XOR to the computed address, so the logical advance within the atom is enough.
//   A layout written this way is also free of shared-memory bank conflicts for 16-byte cp.async
//   stores (8 consecutive chunks of one row, or one chunk of 8 consecutive rows, hit 8 distinct
//   16-byte bank groups).
//
// Matrix descriptor (64 bits; addresses and offsets in 16-byte units, i.e. bytes >> 4):
//   bits [0, 14)   start address (shared-state-space byte address >> 4)
//   bits [16, 30)  leading-dimension byte offset (LBO) >> 4: the distance between core matrices
//                  adjacent in K. Not used by swizzled K-major layouts (the K extent of one
//                  instruction, 32 bytes, lies within a 128-byte row); the ISA says "assumed 1",
//                  and 1 is what we write.
//   bits [32, 46)  stride-dimension byte offset (SBO) >> 4: the distance between 8-row groups
//                  (core matrices adjacent in M or N): 1024 bytes, one swizzle atom.
//   bits [49, 52)  base offset: 0, because every atom starts 1024-aligned.
//   bits [62, 64)  swizzle: 0 none (interleave), 1 128-byte, 2 64-byte, 3 32-byte.
// Why this layout and not the unswizzled one (8 x 16-byte core matrices, LBO between K
// neighbours, SBO between row neighbours): with the 128-byte swizzle LBO is unused, so the only
// numbers to get right are the XOR rule and SBO = 1024; it is the layout the bulk tensor copy
// engine produces (a later TMA producer writes the same bytes); and cp.async stores into it are
// conflict-free without padding.
//
// A from registers (the "RS" form: wgmma.mma_async ... d, {a0, a1, a2, a3}, b-desc, ...): each
// warp w of the warpgroup holds rows [16 w, 16 w + 16) of A [64 x 16] in the mma.sync m16n8k16 A
// layout, 4 .b32 registers of two bf16 (the lower k in the low half):
//   a0 = A[16 w + g][2 q, 2 q + 1]        a1 = A[16 w + g + 8][2 q, 2 q + 1]
//   a2 = A[16 w + g][2 q + 8, 2 q + 9]    a3 = A[16 w + g + 8][2 q + 8, 2 q + 9]
// So the D fragment of an m64nNk16 over 16 consecutive columns (blocks j = 2 kk, 2 kk + 1),
// rounded to bf16 pairwise, is exactly the A fragment of the k16 step kk: a0 = (d[8 kk],
// d[8 kk + 1]), a1 = (d[8 kk + 2], d[8 kk + 3]), a2 = (d[8 kk + 4], d[8 kk + 5]), a3 = (d[8 kk +
// 6], d[8 kk + 7]). The registers are read asynchronously: the caller must not change them before
// the group's wgmma_wait (ptxas keeps them live to it) and fences (wgmma_fence) before the first
// instruction after writing them.
//
// B MN-major (imm-trans-b = 1, allowed for bf16): B [16 x N] (K x N) with the N values of one k
// contiguous. 128-byte swizzle: one k row of 64 n values is 128 bytes, 8 consecutive k rows form
// a 1024-byte atom with the same XOR rule as above (16-byte chunk c of k row r at
// ((c ^ (r % 8)) << 4)); the canonical layout (CUTLASS's notation, in 16-byte units)
// Swizzle<3,4,3> o ((8 elems, 8, m), (8, k)) : ((1, 8 elems, LBO), (64 elems, SBO)), i.e.
//   SBO = the distance between 8-row k groups (atoms adjacent in K): 1024 bytes when the atoms
//         of consecutive k are contiguous;
//   LBO = the distance between 64-wide n groups (atoms adjacent in N); unused when N <= 64 (the
//         instruction's n extent lies within one 128-byte row), set anyway.
// A K-major-in-N tile written for the K-major form above ([rows = k][64 n]) is this layout
// unchanged: the same bytes serve as K-major B of one product (rows are n there) and MN-major B
// of another (rows are k).
//
// Ordering rules this header's users follow (PTX ISA, wgmma "Async Proxy" and wgmma.fence):
//   - wgmma reads shared memory through the async proxy. Shared memory written by ordinary
//     stores or cp.async (generic proxy) is made visible to it by fence_proxy_async() in the
//     writing thread after the write has completed (cp.async.wait_group), then a barrier.
//   - wgmma_fence() before the first wgmma of a batch whose accumulator registers were touched
//     by other instructions (zeroing, or reading the result of an earlier batch).
//   - wgmma_commit() closes a group of issued wgmma; wgmma_wait<n>() returns once at most n of
//     this warpgroup's groups are pending. Shared memory a pending wgmma reads must not be
//     overwritten; its accumulators must not be read. Completion implies the proxy fence back.
//   - Chained wgmma of one shape on the same accumulators need nothing between them: they are
//     ordered by the hardware, in issue order.
//   - fence_operand() keeps the compiler from moving accumulator reads or writes across the
//     asynchronous window (it ties each register to a point in the instruction stream).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsa::cuda {

inline constexpr int kSwizzleRowBytes = 128;    // one K-major row of a 128-byte-swizzled tile
inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows: the alignment and the SBO

// The byte offset of 16-byte chunk c (k values [8 c, 8 c + 8)) of row r in a 128-byte-swizzled
// K-major tile that starts 1024-aligned.
__host__ __device__ __forceinline__ constexpr int swizzle128_offset(int r, int c) {
  return r * kSwizzleRowBytes + ((c ^ (r & 7)) << 4);
}

// The first 1024-aligned byte at or after p in shared memory (dynamic shared memory promises 16
// bytes of alignment; swizzle atoms need 1024: reserve kSwizzleAtomBytes of slack).
__device__ __forceinline__ uint8_t* align_to_atom(uint8_t* p) {
  const uint32_t at = uint32_t(__cvta_generic_to_shared(p));
  return p + ((kSwizzleAtomBytes - (at & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1));
}

// The descriptor of a 128-byte-swizzled K-major operand starting at shared byte address
// `smem_byte_addr` (the tile start, 1024-aligned, plus 32 bytes per k16 block; see above).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_byte_addr) {
  uint64_t desc = uint64_t((smem_byte_addr & 0x3FFFFu) >> 4);  // start address
  desc |= uint64_t(1) << 16;                                   // LBO: unused, "assumed 1"
  desc |= uint64_t(kSwizzleAtomBytes >> 4) << 32;              // SBO: 1024 bytes
  desc |= uint64_t(1) << 62;                                   // 128-byte swizzle
  return desc;
}

// The descriptor of a 128-byte-swizzled MN-major operand (see above) starting at shared byte
// address `smem_byte_addr` (1024-aligned: whole atoms), whose 64-wide n groups lie
// `lbo_bytes` apart.
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(uint32_t smem_byte_addr,
                                                        uint32_t lbo_bytes) {
  uint64_t desc = uint64_t((smem_byte_addr & 0x3FFFFu) >> 4);  // start address
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFFu) << 16;          // LBO: between n groups
  desc |= uint64_t(kSwizzleAtomBytes >> 4) << 32;              // SBO: between k groups
  desc |= uint64_t(1) << 62;                                   // 128-byte swizzle
  return desc;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) become visible to the async proxy
// (wgmma, bulk copies).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The same for every state space: also orders this thread's stores to another CTA's shared
// memory (distributed shared memory) before the async proxy reads them there.
__device__ __forceinline__ void fence_proxy_async_all() {
  asm volatile("fence.proxy.async;\n" ::: "memory");
}
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
// Every register of a wgmma accumulator array (kTiles tiles of 32 f32 per thread) zeroed, or
// fenced.
template <int kTiles>
__device__ __forceinline__ void zero_accumulators(float (&acc)[kTiles][32]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[t][i] = 0.0f;
  }
}
template <int kTiles>
__device__ __forceinline__ void fence_accumulators(float (&acc)[kTiles][32]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(acc[t][i]);
  }
}

// d = A * B + d: one wgmma.mma_async.m64nNk16.f32.bf16.bf16, A and B from shared memory through
// their descriptors, B K-major, A K-major (kTransA = 0) or MN-major (kTransA = 1: imm-trans-a,
// the features of one k contiguous, the layout of B MN-major above), scale-d = 1 (always
// accumulate: chains start from registers zeroed by the caller), no negation.
template <int kN>
struct WgmmaBf16;  // run<kTransA>: the instruction for this N (specializations below)
template <int kN, int kTransA = 0>
__device__ __forceinline__ void wgmma_bf16(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
  WgmmaBf16<kN>::template run<kTransA>(d, desc_a, desc_b);
}

template <>
struct WgmmaBf16<8> {
  template <int kTransA>
  __device__ __forceinline__ static void run(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3}, "
        "%4, %5, p, 1, 1, %7, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA));
  }
};
template <>
struct WgmmaBf16<16> {
  template <int kTransA>
  __device__ __forceinline__ static void run(float (&d)[8], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7}, "
        "%8, %9, p, 1, 1, %11, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA));
  }
};
template <>
struct WgmmaBf16<32> {
  template <int kTransA>
  __device__ __forceinline__ static void run(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, %19, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA));
  }
};
// The same for N = 32 with the operands at compile-time offsets from two base descriptors
// (kOffA, kOffB: byte offsets / 16, added to the start-address field inside the instruction's
// asm block, so a chain of these keeps two descriptors live instead of two per instruction; the
// sums stay below 2^14, the field's width, for any shared address).
template <int kOffA, int kOffB>
__device__ __forceinline__ void wgmma_bf16_n32_at(float (&d)[16], uint64_t desc_a,
                                                  uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %18, 0;\n"
      "add.s64 da, %16, %19;\nadd.s64 db, %17, %20;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "da, db, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kOffA), "n"(kOffB));
}
// The same for N = 64 (the warp-specialized sparse MLA kernel's S over a whole 64-token chunk).
template <int kOffA, int kOffB>
__device__ __forceinline__ void wgmma_bf16_n64_at(float (&d)[32], uint64_t desc_a,
                                                  uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %34, 0;\n"
      "add.s64 da, %32, %35;\nadd.s64 db, %33, %36;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "da, db, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kOffA), "n"(kOffB));
}
template <>
struct WgmmaBf16<64> {
  template <int kTransA>
  __device__ __forceinline__ static void run(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, %35, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA));
  }
};
template <>
struct WgmmaBf16<128> {
  template <int kTransA>
  __device__ __forceinline__ static void run(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, %67, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA));
  }
};

// d = A * B + d, m64n64k16: A [64 x 16] bf16 from registers (the layout above), B [16 x 64] bf16
// MN-major from shared memory (imm-trans-b = 1), scale-d = 1, no negation.
__device__ __forceinline__ void wgmma_bf16_rs_mn64(float (&d)[32], const uint32_t (&a)[4],
                                                   uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

}  // namespace dsa::cuda

namespace dsa::cuda {

// d = A * B + d: one wgmma.mma_async.m64nNk16.f32.f16.f16, otherwise exactly wgmma_bf16 (the same
// descriptors, fragments and ordering rules; scale-d = 1, the caller zeroes the chain's start).
// f16 holds every e4m3 value exactly, so fp8 operands widened to f16 multiply exactly here, and
// the f32 accumulation is the bf16 instruction's (unlike the e4m3 wgmma, whose accumulation is
// narrower than f32).
template <int kN>
__device__ __forceinline__ void wgmma_f16(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b);

template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_f16<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

}  // namespace dsa::cuda

namespace dsa::cuda {

// d = A * B + d, m64n64k16 f16: A [64 x 16] from registers (the register-A layout above, f16
// pairs, the lower k in the low half), B [16 x 64] K-major from shared memory through its
// descriptor (imm-trans-b = 0), scale-d = 1, no negation. The same rules as the register-A bf16
// form: the caller fences (wgmma_fence) after writing A and the zeroed accumulators, and changes
// neither before the group's wgmma_wait.
__device__ __forceinline__ void wgmma_f16_rs64(float (&d)[32], const uint32_t (&a)[4],
                                               uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// d = A * B (+ d when accumulate): wgmma.mma_async.m64nNk32.f32.e4m3.e4m3 for N in {8, 16, 32,
// 64}, both operands K-major in shared memory (e4m3 has no transpose; a k32 step is 32 bytes of a
// 128-byte swizzled row, as a bf16 k16 step). The D fragment is the bf16 instruction's. The e4m3
// products are exact; the tensor core sums them into an accumulator of about 13 mantissa bits
// (an instruction's 32 products aligned to the largest and truncated), not f32.
template <int kN>
struct WgmmaE4m3;  // run: the instruction for this N (specializations below)
template <int kN>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                           int accumulate) {
  WgmmaE4m3<kN>::run(d, desc_a, desc_b, accumulate);
}
template <>
struct WgmmaE4m3<8> {
  __device__ __forceinline__ static void run(float (&d)[4], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3}, "
        "%4, %5, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
};
template <>
struct WgmmaE4m3<16> {
  __device__ __forceinline__ static void run(float (&d)[8], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7}, "
        "%8, %9, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
};
template <>
struct WgmmaE4m3<32> {
  __device__ __forceinline__ static void run(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
};
template <>
struct WgmmaE4m3<64> {
  __device__ __forceinline__ static void run(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
};

}  // namespace dsa::cuda
