// The indexer's logits over a paged index-K cache (DESIGN §1.5) on tensor cores.
//
// Both variants share the arithmetic, so they give the same bits (the tests check it): S[h, t] =
// q[h] . k[t] on the m16n8k16 mma for 16 heads x 8 tokens, k steps ascending from zero; then per
// lane, m-tiles ascending, sum += w_lo * relu(S_lo) + w_hi * relu(S_hi) (one fma, one mul, one
// add); then over the 8 lanes of a column in a fixed tree (lanes xor 4, then 8, then 16); times
// k_scale for fp8. fp8 runs on the f16 mma: sm_90 has no e4m3 mma.sync, and every e4m3 value is
// exact in f16 (the packed cvt widens 2 at a time), so the dot products take the CPU's exact
// q8 * k8 products, summed in f32. A row's logits never depend on other rows, the chunking or the
// variant: the grid is fixed by the host sizes and the work per block only by that row's seq_len.
//
// The k (dim) order inside an mma is a free permutation as long as A and B agree, so each lane
// owns the bytes [u*64 + c*16, +16) of a token row (c = lane % 4, u = one 16-byte piece), which
// makes every copy cover contiguous 64-byte runs. word_byte() is that permutation. Tokens come in
// groups of 32 (4 n-tiles of 8), always inside one page.
//
// Variant "resident" (the default): blocks of 4 warps, two blocks per SM (237-255 registers, 84
// KiB fp8 / 96 KiB bf16 of shared memory). Each warp keeps the whole query as mma A fragments in
// registers (64 heads x 128 dims as f16 or bf16: 128 registers per lane) and streams its groups
// through a private cp.async ring in shared memory, kStages deep (fp8 5: four groups, 16.5 KiB,
// in flight per warp while it computes one, 132 KiB per SM; bf16 3). A block first reads its page
// ids and queues its first groups' keys, then loads, quantizes and lays out the query while they
// arrive (the query's bytes are the ring's last stage until the warps hold it). Per 32-token
// group a warp does 128 mma, 64 packed cvt (fp8), 8 16-byte shared loads of keys and 7 shuffles
// (a reduce-scatter of the 8 column sums). Short blocks (a long row over the whole GPU) run in
// clusters of 4 that share the query's preparation: each block quantizes 16 heads (e4m3 by the
// conversion unit) into all four blocks' shared memory. No key or scale at or past seq_len is
// read: the last group's copies of those tokens are zero-filled (cp.async with a source size of
// 0), where the legacy variant reads the whole 32-token group inside the row's last page.
//   Napkin, H200 (132 SMs, ~1.9 GHz, 4.25 TB/s copy): a token is 132 B (fp8) and 16384 flop.
//   mma.sync f16 sustains ~2100-2600 flop/clk/SM (half to two thirds of the wgmma peak), 6-8
//   clk/token/SM; HBM gives 32 B/ns/SM, 4.1 ns/token = 7.9 clk; the 64 cvt/token go to the
//   conversion pipe (<= 4 clk/token at 16/clk/SM); the head sum is ~1.3 clk/token of fp32 work.
//   These overlap: fp8 B=64 L=32K (2.1M tokens, 16K per SM) is ~65 us of bytes and 50-62 us of
//   mma, so ~75-90 us if they overlap well (target <= 95); B=1 L=128K (1000 tokens per SM: all
//   of a block's 4 groups per warp are in flight before its query is ready) is ~4 us of bytes
//   or mma after ~1.5-2 us of seq_len, page-id and query latency, so ~6 us.
//   Shared-memory traffic is 256 B/token (the ring, written once and read once); the former
//   kernel also reread the query's A fragments from shared memory every group (512 B/token),
//   which with the mma made it co-limited at ~15 clk/token (124 us).

// Variant "legacy": the former kernel, 8 warps per block, the query's A fragments in shared memory
// and reread each group; fp8 keys through a 2-stage per-warp cp.async ring, bf16 keys loaded
// straight into registers.
//
// DSA_CUDA_INDEXER_VARIANT (legacy | resident) forces a variant; DSA_CUDA_INDEXER_BLOCK_TOKENS (a
// power of two in [512, 8192]) the tokens per block, else the largest that still gives two
// blocks per SM over the batch: few long blocks amortize the per-block query setup at large
// batches, many short ones spread a single long row over the GPU; DSA_CUDA_INDEXER_CLUSTER (1, 2
// or 4) the resident variant's blocks per cluster.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "dsa/token_codec.h"

namespace dsa::cuda {
namespace {

namespace cg = cooperative_groups;

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
    l.w[i] = real ? p.w[int64_t(row) * p.ld_w + h] : 0.0f;
  }
}

// float_to_fp8(x).bits with the conversion unit: round to nearest even, saturated to +-448 (the
// infinities too), the sign of zero kept, NaN 0x7f.
__device__ __forceinline__ uint32_t e4m3_bits(float x) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(0.0f), "f"(x));
  return x != x ? 0x7fu : uint32_t(pair & 0xff);
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
    // The same encoder as the CPU: amax with NaN never winning, exact scale, x / scale.
    float amax = 0.0f;
    for (int j = 0; j < 4; ++j) {
      const float a = x[j] < 0 ? -x[j] : x[j];
      amax = a > amax ? a : amax;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, amax, o);
      amax = other > amax ? other : amax;
    }
    const float s_q = fp8_scale_for_amax(amax, ScaleRounding::kExact);
    out = make_uint2(0, 0);
    for (int j = 0; j < 4; ++j) {
      const float scaled = x[j] / s_q;
      out.x |= (kFastCvt ? e4m3_bits(scaled) : uint32_t(float_to_fp8(scaled).bits)) << (8 * j);
    }
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
__device__ void bad_page_group(const IndexerLogitsParams& p, int64_t t0, int64_t seq_len,
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

// ---- variant "legacy" --------------------------------------------------------------------------

constexpr int kLegacyWarps = 8;
constexpr int kLegacyThreads = kLegacyWarps * 32;
constexpr int kLegacyStages = 2;
constexpr int kLegacyStagedSmemBytes =
    kLegacyWarps * kLegacyStages * Stage<KvDtype::kFp8>::kBytes;  // dynamic, fp8 only

struct SharedQuery {
  uint4 frag[kMaxMTiles * 8 * 32];   // A fragments [m-tile][k-step][lane], 4 regs each
  uint8_t natural[kMaxHeads * 256];  // q per head as bf16 or e4m3 bytes, [head][256 bytes]
  float weight[kMaxHeads];           // w, or w * s_q for fp8; 0 for padded heads
};

// Builds the A fragments from s.natural with the lane permutation of the key loads.
template <KvDtype D>
__device__ void build_fragments(int m_tiles, SharedQuery& s) {
  const int total = m_tiles * kKSteps * 32;
  for (int i = threadIdx.x; i < total; i += kLegacyThreads) {
    const int lane = i % 32, ks = (i / 32) % kKSteps, mt = i / (32 * kKSteps);
    s.frag[i] = query_fragment<D>(s.natural, 256, mt, ks, lane);
  }
}

// One warp, the 32 tokens [t0, t0 + 32) of one page whose raw key pieces are in `keys` (B
// fragments of token off0 + n*8 + g): writes their logits where t < seq_len. scales: the fp8
// tokens' scales, indexed by column.
template <KvDtype D>
__device__ void group_logits(const SharedQuery& s, int m_tiles,
                             const uint4 (&keys)[kNTiles][KeyShape<D>::kLoads], const float* scales,
                             int64_t t0, int64_t seq_len, float* logits) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;

  uint2 b[kNTiles][kKSteps];  // fp8 keys are widened once here, not once per m-tile
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) key_fragments<D>(keys[n], b[n]);

  float sum[kNTiles][2] = {};  // columns n*8 + c*2 + {0,1}, partial over rows g, g+8
  for (int mt = 0; mt < m_tiles; ++mt) {
    float acc[kNTiles][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const uint4 a = s.frag[(mt * kKSteps + ks) * 32 + lane];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) mma<D>(acc[n], a, b[n][ks].x, b[n][ks].y);
    }
    const float w_lo = s.weight[mt * 16 + g], w_hi = s.weight[mt * 16 + g + 8];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sum[n][j] = add_heads(sum[n][j], w_lo, acc[n][j], w_hi, acc[n][2 + j]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float v = sum[n][j];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      sum[n][j] = v;
    }
  }
  if (g != 0) return;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = n * 8 + c * 2 + j;
      const int64_t t = t0 + col;
      if (t >= seq_len) continue;
      float v = sum[n][j];
      if constexpr (D == KvDtype::kFp8) v *= scales[col];
      logits[t] = v;
    }
  }
}

template <KvDtype D>
__global__ void __launch_bounds__(kLegacyThreads)
    indexer_logits_legacy(IndexerLogitsParams p, int block_tokens) {
  constexpr int kLoads = KeyShape<D>::kLoads;
  constexpr bool kStaged = D == KvDtype::kFp8;
  constexpr int kStageBytes = Stage<KvDtype::kFp8>::kBytes;
  const int row = blockIdx.y;
  const int64_t seq_len = clamped_seq_len(p, row);
  const int64_t block_t0 = int64_t(blockIdx.x) * block_tokens;
  if (block_t0 >= seq_len) return;  // padded rows and tails cost one load
  const int64_t block_end = min(seq_len, block_t0 + block_tokens);

  __shared__ SharedQuery s;
  __shared__ int32_t block_pages[kMaxBlockTokens / kPageSize];  // the block's page ids
  extern __shared__ __align__(16) uint8_t staged[];             // fp8: [warp][stage][kStageBytes]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* pages = p.page_table + int64_t(row) * p.ld_page_table;
  static_assert(kMaxBlockTokens / kPageSize <= kLegacyThreads, "one page id per thread");
  if (threadIdx.x < block_tokens / kPageSize && block_t0 + threadIdx.x * kPageSize < block_end) {
    block_pages[threadIdx.x] = pages[block_t0 / kPageSize + threadIdx.x];
  }
  const int heads_padded = (p.heads + 15) / 16 * 16;
  const int m_tiles = heads_padded / 16;
  {
    QueryLoad<kLegacyWarps> q;
    load_query(p, row, q, [](int) { return true; });
    encode_query<D>(q, heads_padded, s.natural, 256, s.weight);
  }
  __syncthreads();  // block_pages and s.natural are complete

  // This warp's groups: t0 = block_t0 + warp * 32 + i * 256 while t0 < block_end.
  const int64_t warp_t0 = block_t0 + warp * kGroupTokens;
  constexpr int kStride = kLegacyWarps * kGroupTokens;
  auto page_of = [&](int64_t t0) { return block_pages[(t0 - block_t0) / kPageSize]; };
  uint8_t* my_stages = staged + warp * kLegacyStages * kStageBytes;
  auto issue = [&](int64_t t0, int i) {  // fp8: the copies of group i, or an empty group
    if (t0 < block_end && valid_page(p, page_of(t0))) {
      stage_group<D>(page_base_of<D>(p, page_of(t0)), int(t0 % kPageSize),
                     my_stages + (i % kLegacyStages) * kStageBytes);
    }
    cp_async_commit();
  };
  if constexpr (kStaged) issue(warp_t0, 0);  // in flight while the fragments are built

  build_fragments<D>(m_tiles, s);
  __syncthreads();

  float* logits = p.logits + int64_t(row) * p.ld_logits;
  int i = 0;
  for (int64_t t0 = warp_t0; t0 < block_end; t0 += kStride, ++i) {
    const int32_t page = page_of(t0);
    uint4 keys[kNTiles][kLoads];
    const float* scales = nullptr;
    if constexpr (kStaged) {
      issue(t0 + kStride, i + 1);
      cp_async_wait<1>();  // group i has landed (this lane's copies)
      __syncwarp();        // and every lane's: the scales cross lanes
      if (valid_page(p, page)) {
        const uint8_t* stage = my_stages + (i % kLegacyStages) * kStageBytes;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) staged_keys<D>(stage, n, keys[n]);
        scales = reinterpret_cast<const float*>(stage + Stage<D>::kKeyBytes);
      }
    } else if (valid_page(p, page)) {
      const uint8_t* base = page_base_of<D>(p, page);
      const int g = lane / 4, c = lane % 4, off0 = int(t0 % kPageSize);
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const uint8_t* key_row = base + int64_t(off0 + n * 8 + g) * KeyShape<D>::kRowBytes;
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          keys[n][u] = __ldg(reinterpret_cast<const uint4*>(key_row + u * 64 + c * 16));
        }
      }
    }
    if (valid_page(p, page)) {
      group_logits<D>(s, m_tiles, keys, scales, t0, seq_len, logits);
    } else {
      bad_page_group(p, t0, seq_len, logits);
    }
    if constexpr (kStaged) __syncwarp();  // every lane is done with stage i before it is reused
  }
}

// ---- variant "resident" ------------------------------------------------------------------------

constexpr int kResWarps = 4;
constexpr int kResThreads = kResWarps * 32;
constexpr int kResStride = kResWarps * kGroupTokens;  // a warp's groups are this many tokens apart
constexpr int kResMaxGroups = kMaxBlockTokens / kResStride;  // per warp
static_assert(kResMaxGroups <= 64, "a warp's page ids fit in two registers per lane");
static_assert(kMinBlockTokens % kResStride == 0, "every warp has a whole number of groups");

// The ring is [stage][warp][Stage bytes]. The natural query and the weights live in the last
// stage's bytes: the prologue fills stages 0 .. kStages-2, and stage kStages-1 is first written
// after the query is in registers (and a barrier).
template <KvDtype D>
struct Resident {
  static constexpr int kStages = D == KvDtype::kFp8 ? 5 : 3;
  static constexpr int kStageRowBytes = kResWarps * Stage<D>::kBytes;  // one stage, every warp
  // Natural query bytes per head: a row and 64 bytes, so that the 8 lanes of a 16-byte shared
  // load phase (rows g, g + 1, columns c) hit 8 distinct 16-byte bank groups.
  static constexpr int kQueryStride = KeyShape<D>::kRowBytes + 64;
  static constexpr int kQueryBytes = kMaxHeads * kQueryStride + kMaxHeads * 4;
  static constexpr int kSmemBytes = kStages * kStageRowBytes;
  static_assert(kQueryBytes <= kStageRowBytes, "the query fits in the last stage");
};

// One warp, the staged group of 32 tokens [t0, t0 + 32) of one page: writes their logits where
// t < seq_len. a, w_lo, w_hi: the query's A fragments and the weights of heads mt*16 + g (+ 8).
template <KvDtype D, int kMT>
__device__ __forceinline__ void resident_group(const uint4 (&a)[kMT][kKSteps],
                                               const float (&w_lo)[kMT], const float (&w_hi)[kMT],
                                               const uint8_t* stage, int64_t t0, int64_t seq_len,
                                               float* logits) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  float v[2 * kNTiles];  // v[n*2 + j]: column n*8 + c*2 + j, partial over heads g, g+8 (+16k)
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    uint4 raw[KeyShape<D>::kLoads];
    staged_keys<D>(stage, n, raw);
    uint2 b[kKSteps];
    key_fragments<D>(raw, b);
    float acc[kMT][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) mma<D>(acc[mt], a[mt][ks], b[ks].x, b[ks].y);
    }
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      s0 = add_heads(s0, w_lo[mt], acc[mt][0], w_hi[mt], acc[mt][2]);
      s1 = add_heads(s1, w_lo[mt], acc[mt][1], w_hi[mt], acc[mt][3]);
    }
    v[n * 2] = s0;
    v[n * 2 + 1] = s1;
  }
  // Reduce-scatter of the 8 column sums over the 8 lanes g of a column: the pairs (xor 4, then 8,
  // then 16) of the legacy variant's all-reduce, so the same bits, in 7 shuffles instead of 24.
  // Lane g ends with value m = 4 (g & 1) + 2 ((g >> 1) & 1) + (g >> 2).
  const bool b0 = g & 1, b1 = (g >> 1) & 1, b2 = (g >> 2) & 1;
  float v4[4], v2[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float send = b0 ? v[k] : v[k + 4], keep = b0 ? v[k + 4] : v[k];
    v4[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float send = b1 ? v4[k] : v4[k + 2], keep = b1 ? v4[k + 2] : v4[k];
    v2[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  const float send = b2 ? v2[0] : v2[1], keep = b2 ? v2[1] : v2[0];
  float sum = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  const int m = 4 * int(b0) + 2 * int(b1) + int(b2);
  const int col = (m >> 1) * 8 + c * 2 + (m & 1);
  if constexpr (D == KvDtype::kFp8) {
    sum *= reinterpret_cast<const float*>(stage + Stage<D>::kKeyBytes)[col];
  }
  if (t0 + col < seq_len) logits[t0 + col] = sum;
}

// This lane's A fragments of the whole query, as query_fragment makes them (the same bits), from
// 16-byte loads: the lane's words of a head row are its kLoads pieces [u*64 + c*16, +16).
template <KvDtype D, int kMT>
__device__ __forceinline__ void resident_query(const uint8_t* natural, int stride, int lane,
                                               uint4 (&a)[kMT][kKSteps]) {
  constexpr int kLoads = KeyShape<D>::kLoads;
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    uint4 r0[kLoads], r1[kLoads];  // rows g and g + 8 of the m-tile
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      r0[u] = *reinterpret_cast<const uint4*>(natural + (mt * 16 + g) * stride + u * 64 + c * 16);
      r1[u] =
          *reinterpret_cast<const uint4*>(natural + (mt * 16 + g + 8) * stride + u * 64 + c * 16);
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if constexpr (D == KvDtype::kBf16) {
        const int w0 = 2 * ks, w1 = 2 * ks + 1;
        a[mt][ks] = make_uint4(word_of(r0[w0 / 4], w0 % 4), word_of(r1[w0 / 4], w0 % 4),
                               word_of(r0[w1 / 4], w1 % 4), word_of(r1[w1 / 4], w1 % 4));
      } else {
        const uint2 lo = e4m3x4_to_f16x4(word_of(r0[ks / 4], ks % 4));
        const uint2 hi = e4m3x4_to_f16x4(word_of(r1[ks / 4], ks % 4));
        a[mt][ks] = make_uint4(lo.x, hi.x, lo.y, hi.y);
      }
    }
  }
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// kMT: the m-tiles of 16 heads, (heads + 15) / 16. Launched in clusters of 1, 2 or 4 blocks along
// a row (the grid's x padded to a whole number of clusters): block rank r of n quantizes heads
// [r * 64 / n, (r + 1) * 64 / n) and stores them into every block's query, so a short block pays
// 1/n of the query's loads and quantization.
template <KvDtype D, int kMT>
__global__ void __launch_bounds__(kResThreads, 2)
    indexer_logits_resident(IndexerLogitsParams p, int block_tokens, int ranks) {
  using R = Resident<D>;
  constexpr int kStages = R::kStages;
  const int rank = int(blockIdx.x) % ranks;  // in the cluster (of ranks blocks along x)
  const int row = blockIdx.y;
  const int64_t seq_len = clamped_seq_len(p, row);
  const int64_t block_t0 = int64_t(blockIdx.x) * block_tokens;
  if (block_t0 - int64_t(rank) * block_tokens >= seq_len) return;  // the whole cluster: past
  if (ranks > 1) cluster_arrive_relaxed();  // started: the others may store into its query
  const int64_t block_end = min(seq_len, block_t0 + block_tokens);  // < block_t0: no groups

  extern __shared__ __align__(16) uint8_t smem[];  // the ring; the query in its last stage
  uint8_t* natural = smem + (kStages - 1) * R::kStageRowBytes;
  float* weight = reinterpret_cast<float*>(natural + kMaxHeads * R::kQueryStride);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto stage_of = [&](int i) {  // group i's stage of this warp
    return smem + (i % kStages) * R::kStageRowBytes + warp * Stage<D>::kBytes;
  };

  // This warp's groups: i = 0 .. groups-1 at t0 = warp_t0 + i * kResStride, inside one page.
  const int64_t warp_t0 = block_t0 + warp * kGroupTokens;
  const int groups =
      warp_t0 < block_end ? int((block_end - warp_t0 + kResStride - 1) / kResStride) : 0;
  // Their page ids (group lane in pid0, group lane + 32 in pid1), then this block's heads of the
  // query: all these loads are issued before anything waits on one.
  const int32_t* pages = p.page_table + int64_t(row) * p.ld_page_table;
  int32_t pid0 = -1, pid1 = -1;
  if (lane < groups) pid0 = pages[(warp_t0 + int64_t(lane) * kResStride) / kPageSize];
  if (lane + 32 < groups) pid1 = pages[(warp_t0 + int64_t(lane + 32) * kResStride) / kPageSize];
  const int heads_per_rank = kMaxHeads / ranks;
  auto own = [&](int h) { return h / heads_per_rank == rank; };
  QueryLoad<kResWarps> q;
  load_query(p, row, q, own);

  auto page_of = [&](int i) {  // warp-uniform i < groups
    return __shfl_sync(0xffffffffu, i < 32 ? pid0 : pid1, i & 31);
  };
  auto issue = [&](int i) {  // the copies of group i into its stage, or an empty group
    if (i < groups) {
      const int32_t page = page_of(i);
      if (valid_page(p, page)) {
        const int64_t t0 = warp_t0 + int64_t(i) * kResStride;
        const int valid = int(min(int64_t(kGroupTokens), seq_len - t0));
        stage_group<D, true>(page_base_of<D>(p, page), int(t0 % kPageSize), stage_of(i), valid);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);  // in flight while the query is prepared

  if (ranks > 1) cluster_wait();  // every block of the cluster has started
#pragma unroll
  for (int i = 0; i < QueryLoad<kResWarps>::kHeadsPerWarp; ++i) {
    const int h = warp + i * kResWarps;
    if (h >= kMT * 16 || !own(h)) continue;  // warp-uniform
    uint2 e;
    const float w = encode_head<D, true>(q.x[i], q.w[i], e);
    if (ranks == 1) {  // no cluster launched: plain shared memory
      store_head<D>(natural, R::kQueryStride, h, e);
      if (lane == 0) weight[h] = w;
    }
    for (int r = 0; r < ranks && ranks > 1; ++r) {
      cg::cluster_group cluster = cg::this_cluster();
      store_head<D>(cluster.map_shared_rank(natural, unsigned(r)), R::kQueryStride, h, e);
      if (lane == 0) cluster.map_shared_rank(weight, unsigned(r))[h] = w;
    }
  }
  if (ranks > 1) {
    cg::this_cluster().sync();  // every block's natural query and weights are complete
  } else {
    __syncthreads();
  }
  if (block_t0 >= seq_len) return;  // a block past the row that only helped with the query

  const int g = lane / 4;
  uint4 a[kMT][kKSteps];
  float w_lo[kMT], w_hi[kMT];
  resident_query<D, kMT>(natural, R::kQueryStride, lane, a);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    w_lo[mt] = weight[mt * 16 + g];
    w_hi[mt] = weight[mt * 16 + g + 8];
  }
  __syncthreads();  // every warp holds the query: its bytes become stage kStages-1

  float* logits = p.logits + int64_t(row) * p.ld_logits;
  for (int i = 0; i < groups; ++i) {
    issue(i + kStages - 1);        // into the stage group i - 1 left (or the query's)
    cp_async_wait<kStages - 1>();  // group i has landed (this lane's copies)
    __syncwarp();                  // and every lane's: the scales cross lanes
    const int32_t page = page_of(i);
    const int64_t t0 = warp_t0 + int64_t(i) * kResStride;
    if (valid_page(p, page)) {
      resident_group<D, kMT>(a, w_lo, w_hi, stage_of(i), t0, seq_len, logits);
    } else {
      bad_page_group(p, t0, seq_len, logits);
    }
    __syncwarp();  // every lane is done with stage i before it is refilled
  }
}

// ---- dispatch ----------------------------------------------------------------------------------

enum class Variant { kLegacy, kResident };

// The forced variant, or the default of the dtype (the H200 measurements in the header).
Variant variant_for(KvDtype dtype) {
  if (const char* v = std::getenv("DSA_CUDA_INDEXER_VARIANT")) {
    if (std::strcmp(v, "legacy") == 0) return Variant::kLegacy;
    if (std::strcmp(v, "resident") == 0) return Variant::kResident;
  }
  // The former kernel stays the default: on the H200 the resident variant took 128.4 us at fp8
  // B = 64, L = 32K (legacy 124.2) and 26.0 us at B = 1, L = 128K (legacy 18.2), bf16 150.1 and
  // 25.9 us (legacy 145.6 and 17.0): bench/results/2026-12-03-h200-attn-mla.md.
  (void)dtype;
  return Variant::kLegacy;
}

// Tokens per block: the override, or the largest size that keeps two blocks per SM (both
// variants hold two blocks per SM).
int block_tokens_for(const IndexerLogitsParams& p) {
  if (const char* v = std::getenv("DSA_CUDA_INDEXER_BLOCK_TOKENS")) {
    const int forced = std::atoi(v);
    if (forced >= kMinBlockTokens && forced <= kMaxBlockTokens && (forced & (forced - 1)) == 0) {
      return forced;
    }
  }
  const int sms = device_sm_count();
  int tokens = kMaxBlockTokens;
  while (tokens > kMinBlockTokens &&
         int64_t(p.rows) * ((p.ld_logits + tokens - 1) / tokens) < 2 * int64_t(sms)) {
    tokens /= 2;
  }
  return tokens;
}

// Above 48 KiB of dynamic shared memory a kernel must opt in, once per device (the current one).
template <typename Kernel>
cudaError_t opt_in(Kernel kernel, int bytes, std::atomic<uint64_t>& done) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = uint64_t(1) << (device % 64);
  if (done.load(std::memory_order_relaxed) & bit) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

// Blocks per cluster of the resident variant: the override (1, 2 or 4), else 4 for short blocks
// (a long row over many SMs, where the query's preparation is a large share of a block) when the
// row has that many, else 1.
int cluster_blocks_for(int block_tokens, int64_t chunks) {
  if (const char* v = std::getenv("DSA_CUDA_INDEXER_CLUSTER")) {
    const int forced = std::atoi(v);
    if (forced == 1 || forced == 2 || forced == 4) return forced;
  }
  return block_tokens <= 1024 && chunks >= 4 ? 4 : 1;
}

template <KvDtype D, int kMT>
cudaError_t launch_resident(const IndexerLogitsParams& p, int block_tokens, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  const cudaError_t e = opt_in(indexer_logits_resident<D, kMT>, Resident<D>::kSmemBytes, opted);
  if (e != cudaSuccess) return e;
  const int64_t chunks = (p.ld_logits + block_tokens - 1) / block_tokens;
  const int ranks = cluster_blocks_for(block_tokens, chunks);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned((chunks + ranks - 1) / ranks * ranks), unsigned(p.rows));
  config.blockDim = dim3(kResThreads);
  config.dynamicSmemBytes = Resident<D>::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster = cluster_dimension(unsigned(ranks));
  config.attrs = &cluster;
  config.numAttrs = ranks > 1 ? 1 : 0;
  const cudaError_t launched =
      cudaLaunchKernelEx(&config, indexer_logits_resident<D, kMT>, p, block_tokens, ranks);
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

template <KvDtype D>
cudaError_t launch(const IndexerLogitsParams& p, Variant variant, cudaStream_t stream) {
  const int block_tokens = block_tokens_for(p);
  if (variant == Variant::kResident) {
    switch ((p.heads + 15) / 16) {
      case 1:
        return launch_resident<D, 1>(p, block_tokens, stream);
      case 2:
        return launch_resident<D, 2>(p, block_tokens, stream);
      case 3:
        return launch_resident<D, 3>(p, block_tokens, stream);
      default:
        return launch_resident<D, 4>(p, block_tokens, stream);
    }
  }
  const dim3 grid(unsigned((p.ld_logits + block_tokens - 1) / block_tokens), unsigned(p.rows));
  if constexpr (D == KvDtype::kFp8) {
    static std::atomic<uint64_t> opted{0};
    const cudaError_t e = opt_in(indexer_logits_legacy<D>, kLegacyStagedSmemBytes, opted);
    if (e != cudaSuccess) return e;
    indexer_logits_legacy<D>
        <<<grid, kLegacyThreads, kLegacyStagedSmemBytes, stream>>>(p, block_tokens);
  } else {
    indexer_logits_legacy<D><<<grid, kLegacyThreads, 0, stream>>>(p, block_tokens);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.heads > kMaxHeads || p.rows > 65535 || p.ld_logits <= 0) {
    return cudaErrorInvalidValue;
  }
  const Variant variant = variant_for(p.pool.dtype);
  return p.pool.dtype == KvDtype::kBf16 ? launch<KvDtype::kBf16>(p, variant, stream)
                                        : launch<KvDtype::kFp8>(p, variant, stream);
}

}  // namespace dsa::cuda
