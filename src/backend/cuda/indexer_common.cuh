// The pieces both variants of the indexer logits kernel share (indexer_logits.cu's header explains
// the design): the key and query shapes, the fragment loads and the e4m3 conversions, the head
// sum, the page and length guards, and the entries of the resident (indexer_resident.cu) and wgmma
// (indexer_wgmma.cu) variants.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/query_fp8.cuh"
#include "dsa/token_codec.h"

namespace dsa::cuda::indexer_detail {

constexpr int kGroupTokens = 32;  // tokens per warp iteration: 4 n-tiles of 8
constexpr int kNTiles = kGroupTokens / 8;
constexpr int kMinBlockTokens = 512;   // a multiple of 8 warps * kGroupTokens
constexpr int kMaxBlockTokens = 8192;  // 128 pages
constexpr int kMaxHeads = 64;          // heads padded to 16; up to 4 m-tiles
constexpr int kMaxMTiles = kMaxHeads / 16;
constexpr int kKSteps = kIndexHeadDim / 16;  // k16 steps (bf16, or f16 from e4m3)

// Key bytes per token and the 16-byte pieces each lane holds per token, by cache dtype.
template <KvDtype D>
struct KeyShape {
  static constexpr int kRowBytes = D == KvDtype::kBf16 ? 256 : 128;
  static constexpr int kLoads = kRowBytes / 64;
};

// Four e4m3 bytes (byte i = element i) widened exactly to f16: .x holds bytes 0-1, .y bytes 2-3,
// the lower byte in the lower half.
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(uint32_t word) {
  uint2 r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n"
      "cvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
      : "=r"(r.x), "=r"(r.y)
      : "r"(word));
  return r;
}

// Byte offset, inside a token's key row, of word w (0 .. 4*kLoads-1) held by lane column c.
__device__ __forceinline__ int word_byte(int c, int w) {
  return (w >> 2) * 64 + c * 16 + (w & 3) * 4;
}

// The row's query, loaded by one warp per head: lane holds dims lane*4 .. +3 of head
// warp + i * kW, and that head's weight. All loads are issued before any is used.
template <int kW>
struct QueryLoad {
  static constexpr int kHeadsPerWarp = kMaxHeads / kW;
  float x[kHeadsPerWarp][4], w[kHeadsPerWarp];
};

// Loads the heads h of this warp (h = warp + i * kW) that satisfy own(h); padded heads are zero.
template <int kW, typename Own>
__device__ __forceinline__ void load_query(const IndexerLogitsParams& p, int row, QueryLoad<kW>& l,
                                           Own own) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < QueryLoad<kW>::kHeadsPerWarp; ++i) {
    const int h = warp + i * kW;
    const bool real = h < p.heads && own(h);
    const float* qh = p.q + int64_t(row) * p.ld_q + int64_t(h) * kIndexHeadDim + lane * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) l.x[i][j] = real ? qh[j] : 0.0f;
    l.w[i] = real ? __fmul_rn(p.w_scale, p.w[int64_t(row) * p.ld_w + h]) : 0.0f;
  }
}

// This lane's 4 dims of one head, encoded in `out`: fp8 the e4m3 bytes in .x (byte j = dim j),
// bf16 the bf16 values in .x (dims 0-1) and .y (dims 2-3), the lower dim in the lower half.
// Returns the head's weight: w, or w * s_q for fp8. Warp-collective for fp8 (the head's amax).
// kFastCvt: e4m3 by e4m3_bits (a few instructions) instead of float_to_fp8's integer code (a few
// dozen, which at B = 1 cost a block microseconds); the bits are the same (the tests compare the
// variants, one of each).
template <KvDtype D, bool kFastCvt>
__device__ __forceinline__ float encode_head(const float (&x)[4], float w, uint2& out) {
  if constexpr (D == KvDtype::kBf16) {
    out.x = uint32_t(float_to_bf16(x[0]).bits) | uint32_t(float_to_bf16(x[1]).bits) << 16;
    out.y = uint32_t(float_to_bf16(x[2]).bits) | uint32_t(float_to_bf16(x[3]).bits) << 16;
    return w;
  } else {
    // The same encoder as the CPU (query_fp8.cuh).
    uint32_t bytes;
    const float s_q = encode_fp8_head<kFastCvt>(x, bytes);
    out = make_uint2(bytes, 0);
    return w * s_q;  // 0 for padded heads
  }
}

// Stores this lane's encoded dims of head h into a natural query ([head][stride] bytes).
template <KvDtype D>
__device__ __forceinline__ void store_head(uint8_t* natural, int stride, int h, const uint2& e) {
  const int lane = threadIdx.x % 32;
  if constexpr (D == KvDtype::kBf16) {
    *reinterpret_cast<uint2*>(natural + h * stride + lane * 8) = e;
  } else {
    *reinterpret_cast<uint32_t*>(natural + h * stride + lane * 4) = e.x;
  }
}

// Quantizes (or rounds) the loaded query into `natural` and `weight` (w, or w * s_q for fp8; 0
// for padded heads), for heads < heads_padded.
template <KvDtype D, int kW>
__device__ __forceinline__ void encode_query(const QueryLoad<kW>& l, int heads_padded,
                                             uint8_t* natural, int stride, float* weight) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < QueryLoad<kW>::kHeadsPerWarp; ++i) {
    const int h = warp + i * kW;
    if (h >= heads_padded) break;  // warp-uniform
    uint2 e;
    const float w = encode_head<D, false>(l.x[i], l.w[i], e);
    store_head<D>(natural, stride, h, e);
    if (lane == 0) weight[h] = w;
  }
}

// The A fragment (m-tile mt, k-step ks) of this lane from the natural query, with the lane
// permutation of the keys.
template <KvDtype D>
__device__ __forceinline__ uint4 query_fragment(const uint8_t* natural, int stride, int mt, int ks,
                                                int lane) {
  const int g = lane / 4, c = lane % 4;
  const uint8_t* n0 = natural + (mt * 16 + g) * stride;
  const uint8_t* n1 = n0 + 8 * stride;
  if constexpr (D == KvDtype::kBf16) {
    // Word 2*ks is the low k half (a0/a1), word 2*ks+1 the high half (a2/a3), as in the keys.
    const int b_lo = word_byte(c, 2 * ks), b_hi = word_byte(c, 2 * ks + 1);
    return make_uint4(*reinterpret_cast<const uint32_t*>(n0 + b_lo),
                      *reinterpret_cast<const uint32_t*>(n1 + b_lo),
                      *reinterpret_cast<const uint32_t*>(n0 + b_hi),
                      *reinterpret_cast<const uint32_t*>(n1 + b_hi));
  } else {
    // Word ks holds the whole k-step: bytes 0-1 the low k half, bytes 2-3 the high, as in the
    // keys (key_fragments).
    const int b = word_byte(c, ks);
    const uint2 lo = e4m3x4_to_f16x4(*reinterpret_cast<const uint32_t*>(n0 + b));
    const uint2 hi = e4m3x4_to_f16x4(*reinterpret_cast<const uint32_t*>(n1 + b));
    return make_uint4(lo.x, hi.x, lo.y, hi.y);
  }
}

template <KvDtype D>
__device__ __forceinline__ void mma(float (&d)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  if constexpr (D == KvDtype::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& u, int i) {
  return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// The B fragments (b0, b1) of one token column for every k-step, from the lane's raw key words.
template <KvDtype D>
__device__ __forceinline__ void key_fragments(const uint4 (&raw)[KeyShape<D>::kLoads],
                                              uint2 (&b)[kKSteps]) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    if constexpr (D == KvDtype::kBf16) {
      const int w0 = 2 * ks, w1 = 2 * ks + 1;
      b[ks] = make_uint2(word_of(raw[w0 / 4], w0 % 4), word_of(raw[w1 / 4], w1 % 4));
    } else {
      b[ks] = e4m3x4_to_f16x4(word_of(raw[ks / 4], ks % 4));
    }
  }
}

// One m-tile's share of a column sum: sum + (w_lo * relu(lo) + w_hi * relu(hi)), rounded exactly
// so in both variants (relu: NaN -> 0, as the CPU).
__device__ __forceinline__ float add_heads(float sum, float w_lo, float lo, float w_hi, float hi) {
  return __fadd_rn(sum, __fmaf_rn(w_lo, fmaxf(lo, 0.0f), __fmul_rn(w_hi, fmaxf(hi, 0.0f))));
}

// Per-warp cp.async staging of key groups (fp8 in both variants, bf16 in "resident"). A stage
// holds the group's keys as [n-tile][piece][g][c] 16-byte pieces (each lane reads back exactly
// the pieces it copied, and a warp's read of one (n, piece) is 512 contiguous bytes), then for
// fp8 the group's 32 fp32 scales.
template <KvDtype D>
struct Stage {
  static constexpr int kKeyBytes = kGroupTokens * KeyShape<D>::kRowBytes;
  static constexpr int kBytes = kKeyBytes + (D == KvDtype::kFp8 ? kGroupTokens * 4 : 0);
};

// The 32 tokens [t0, t0 + 32) of a group lie in one page; their keys and scales start here.
template <KvDtype D>
__device__ __forceinline__ const uint8_t* page_base_of(const IndexerLogitsParams& p, int64_t page) {
  return p.pool.data + page * index_k_page_bytes(D);
}

// 16 bytes from global to shared memory, of which only the first `bytes` (0 to 16) are read; the
// rest are zero-filled.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(global), "r"(bytes)
               : "memory");
}

// Queues the copies of one group (keys, and for fp8 the scales by lanes 0-7) into a stage. With
// kMasked only the group's first `valid` tokens are read (the rest of the stage is zeros): nothing
// at or past seq_len is touched.
template <KvDtype D, bool kMasked = false>
__device__ __forceinline__ void stage_group(const uint8_t* page_base, int off0, uint8_t* stage,
                                            int valid = kGroupTokens) {
  constexpr int kLoads = KeyShape<D>::kLoads;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    const uint8_t* row = page_base + int64_t(off0 + n * 8 + g) * KeyShape<D>::kRowBytes;
    const int bytes = n * 8 + g < valid ? 16 : 0;
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      uint8_t* dst = stage + ((n * kLoads + u) * 32 + lane) * 16;
      if constexpr (kMasked) {
        cp_async16_zfill(dst, row + u * 64 + c * 16, bytes);
      } else {
        cp_async16(dst, row + u * 64 + c * 16);
      }
    }
  }
  if constexpr (D == KvDtype::kFp8) {
    if (lane < kGroupTokens / 4) {
      uint8_t* dst = stage + Stage<D>::kKeyBytes + lane * 16;
      const uint8_t* src = page_base + kPageSize * kIndexHeadDim + (off0 + lane * 4) * 4;
      if constexpr (kMasked) {
        cp_async16_zfill(dst, src, 4 * min(4, max(0, valid - lane * 4)));
      } else {
        cp_async16(dst, src);
      }
    }
  }
}

// The raw key pieces of n-tile n of a staged group, as this lane copied them.
template <KvDtype D>
__device__ __forceinline__ void staged_keys(const uint8_t* stage, int n,
                                            uint4 (&raw)[KeyShape<D>::kLoads]) {
  constexpr int kLoads = KeyShape<D>::kLoads;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    raw[u] = *reinterpret_cast<const uint4*>(stage + ((n * kLoads + u) * 32 + lane) * 16);
  }
}

// A group whose page id is outside the pool: never read; as the CPU, logits 0 and one error per
// page.
__device__ inline void bad_page_group(const IndexerLogitsParams& p, int64_t t0, int64_t seq_len,
                                      float* logits) {
  const int lane = threadIdx.x % 32;
  if (t0 + lane < seq_len) logits[t0 + lane] = 0.0f;
  if (lane == 0 && t0 % kPageSize == 0 && p.error_count) atomicAdd(p.error_count, 1);
}

__device__ __forceinline__ bool valid_page(const IndexerLogitsParams& p, int32_t page) {
  return page >= 0 && page < p.pool.num_pages;
}

// A length past the logits row or the page table is the CPU's error; here it is clamped so
// nothing outside the row's buffers is touched.
__device__ __forceinline__ int64_t clamped_seq_len(const IndexerLogitsParams& p, int row) {
  return min(int64_t(p.seq_lens[row]), min(p.ld_logits, p.ld_page_table * kPageSize));
}

// The resident variant (indexer_resident.cu) for p.heads heads in blocks of block_tokens tokens.
cudaError_t launch_resident(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream);
// The wgmma variants (indexer_wgmma.cu, indexer_wgmma_pipe.cu): 64 heads x a tile of tokens on
// warpgroup MMA. Their fp8 schedules: kWide tiles of 128 tokens (two blocks per SM), kNarrow of
// 64 (three), kPipe the keys widened into wgmma's A registers while the previous tile's wgmma run
// (three blocks per SM).
// bf16 caches run the one bf16 kernel whatever the schedule.
enum class WgmmaSchedule { kWide, kNarrow, kPipe, kE4m3 };
cudaError_t launch_wgmma(const IndexerLogitsParams& p, int block_tokens, WgmmaSchedule schedule,
                         cudaStream_t stream);

}  // namespace dsa::cuda::indexer_detail
