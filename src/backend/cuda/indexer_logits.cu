// The indexer's logits over a paged index-K cache (DESIGN §1.5) on tensor cores.
//
// One block of 8 warps per (row, chunk of block_tokens tokens). block_tokens (512 to 8192) is the
// largest that still gives two blocks per SM: few long blocks amortize the per-block query setup
// at large batches, many short ones spread a single long row over the GPU. Every token's logit
// is computed alone, so the chunking never changes a bit. DSA_CUDA_INDEXER_BLOCK_TOKENS (a power
// of two in [512, 8192]) overrides the choice; 2048 is the former fixed size. The row's query is
// prepared once per block in shared memory, already laid out as mma A fragments (bf16, or e4m3
// quantized per head exactly like the CPU and widened to f16); the head weights (times s_q for fp8)
// sit beside it. Each warp then takes groups of 32 tokens (always inside one page) and streams
// their keys straight from global memory into B-fragment registers with 16-byte loads: no
// shared-memory staging for keys.
//
// The k (dim) order inside an mma is a free permutation as long as A and B agree, so each lane
// owns the bytes [u*64 + c*16, +16) of a token row (c = lane % 4, u = one 16-byte load), which
// makes every load instruction cover contiguous 64-byte runs. word_byte() is that permutation.
//
// fp8 runs on the f16 m16n8k16 mma too: sm_90 has no native e4m3 mma.sync (the compiler would
// emulate it with conversions inside every mma), so each key word of 4 e4m3 bytes is widened once
// per group with the packed cvt to two f16x2 registers, one 32-bit word per k-step. Every e4m3
// value is exact in f16 and every product of two is exact in f32, so the dot products are the
// CPU's exact q8 * k8 products summed in f32.
//
// Per group: S[h, t] = q[h] . k[t] for 16 heads x 8 tokens per mma, relu, times w, summed over
// heads in registers and then over the 8 lanes of a column with xor shuffles (a fixed order),
// times k_scale for fp8. A row's logits never depend on other rows: the grid is fixed by the
// host sizes and the work per block only by that row's seq_len.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "dsa/token_codec.h"

namespace dsa::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kGroupTokens = 32;  // tokens per warp iteration: 4 n-tiles of 8
constexpr int kNTiles = kGroupTokens / 8;
constexpr int kMinBlockTokens = 512;   // a multiple of kWarps * kGroupTokens
constexpr int kMaxBlockTokens = 8192;  // 128 pages
constexpr int kMaxHeads = 64;          // heads padded to 16; up to 4 m-tiles
constexpr int kMaxMTiles = kMaxHeads / 16;

// Key bytes per token and 32-bit words each lane holds per token, by cache dtype.
template <KvDtype D>
struct KeyShape {
  static constexpr int kRowBytes = D == KvDtype::kBf16 ? 256 : 128;
  static constexpr int kLoads = kRowBytes / 64;       // 16-byte loads per lane per token
  static constexpr int kKSteps = kIndexHeadDim / 16;  // k16 steps (bf16, or f16 from e4m3)
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

struct SharedQuery {
  uint4 frag[kMaxMTiles * 8 * 32];   // A fragments [m-tile][k-step][lane], 4 regs each
  uint8_t natural[kMaxHeads * 256];  // q per head as bf16 or e4m3 bytes, [head][row bytes]
  float weight[kMaxHeads];           // w, or w * s_q for fp8; 0 for padded heads
};

// Quantizes (or rounds) the row's q into s.natural and the weights, one warp per head. All of
// a warp's loads are issued before any is used, so the block pays one global latency here.
template <KvDtype D>
__device__ void prepare_natural(const IndexerLogitsParams& p, int row, int heads_padded,
                                SharedQuery& s) {
  constexpr int kHeadsPerWarp = kMaxHeads / kWarps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float x[kHeadsPerWarp][4], w[kHeadsPerWarp];  // dims lane*4 .. +3 of head warp + i*kWarps
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int h = warp + i * kWarps;
    const bool real = h < p.heads;  // padded heads are zero
    const float* qh = p.q + int64_t(row) * p.ld_q + int64_t(h) * kIndexHeadDim + lane * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) x[i][j] = real ? qh[j] : 0.0f;
    w[i] = real ? p.w[int64_t(row) * p.ld_w + h] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int h = warp + i * kWarps;
    if (h >= heads_padded) break;  // warp-uniform
    if constexpr (D == KvDtype::kBf16) {
      Bf16* dst = reinterpret_cast<Bf16*>(s.natural + h * 256) + lane * 4;
      for (int j = 0; j < 4; ++j) dst[j] = float_to_bf16(x[i][j]);
      if (lane == 0) s.weight[h] = w[i];
    } else {
      // The same encoder as the CPU: amax with NaN never winning, exact scale, x / scale.
      float amax = 0.0f;
      for (int j = 0; j < 4; ++j) {
        const float a = x[i][j] < 0 ? -x[i][j] : x[i][j];
        amax = a > amax ? a : amax;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = other > amax ? other : amax;
      }
      const float s_q = fp8_scale_for_amax(amax, ScaleRounding::kExact);
      uint8_t* dst = s.natural + h * 256 + lane * 4;
      for (int j = 0; j < 4; ++j) dst[j] = float_to_fp8(x[i][j] / s_q).bits;
      if (lane == 0) s.weight[h] = w[i] * s_q;  // 0 for padded heads
    }
  }
}

// Builds the A fragments from s.natural with the lane permutation of the key loads.
template <KvDtype D>
__device__ void build_fragments(int m_tiles, SharedQuery& s) {
  using Shape = KeyShape<D>;
  const int total = m_tiles * Shape::kKSteps * 32;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int lane = i % 32, ks = (i / 32) % Shape::kKSteps, mt = i / (32 * Shape::kKSteps);
    const int g = lane / 4, c = lane % 4;
    const int h0 = mt * 16 + g, h1 = h0 + 8;
    const uint8_t* n0 = s.natural + h0 * 256;
    const uint8_t* n1 = s.natural + h1 * 256;
    uint4 f;
    if constexpr (D == KvDtype::kBf16) {
      // Word 2*ks is the low k half (a0/a1), word 2*ks+1 the high half (a2/a3), as in the keys.
      const int b_lo = word_byte(c, 2 * ks), b_hi = word_byte(c, 2 * ks + 1);
      f.x = *reinterpret_cast<const uint32_t*>(n0 + b_lo);
      f.y = *reinterpret_cast<const uint32_t*>(n1 + b_lo);
      f.z = *reinterpret_cast<const uint32_t*>(n0 + b_hi);
      f.w = *reinterpret_cast<const uint32_t*>(n1 + b_hi);
    } else {
      // Word ks holds the whole k-step: bytes 0-1 the low k half, bytes 2-3 the high, as in the
      // keys (key_fragments).
      const int b = word_byte(c, ks);
      const uint2 lo = e4m3x4_to_f16x4(*reinterpret_cast<const uint32_t*>(n0 + b));
      const uint2 hi = e4m3x4_to_f16x4(*reinterpret_cast<const uint32_t*>(n1 + b));
      f = make_uint4(lo.x, hi.x, lo.y, hi.y);
    }
    s.frag[i] = f;
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
                                              uint2 (&b)[KeyShape<D>::kKSteps]) {
#pragma unroll
  for (int ks = 0; ks < KeyShape<D>::kKSteps; ++ks) {
    if constexpr (D == KvDtype::kBf16) {
      const int w0 = 2 * ks, w1 = 2 * ks + 1;
      b[ks] = make_uint2(word_of(raw[w0 / 4], w0 % 4), word_of(raw[w1 / 4], w1 % 4));
    } else {
      b[ks] = e4m3x4_to_f16x4(word_of(raw[ks / 4], ks % 4));
    }
  }
}

// fp8 keys are staged per warp in shared memory by cp.async, kStages groups deep, so a warp's
// next group is in flight while it computes the current one. A stage holds the group's keys as
// [n-tile][load][g][c] 16-byte pieces (each lane reads back exactly the pieces it copied, and a
// warp's read of one (n, load) is 512 contiguous bytes), then the group's 32 fp32 scales.
constexpr int kStages = 2;
constexpr int kStageKeyBytes = kGroupTokens * 128;
constexpr int kStageBytes = kStageKeyBytes + kGroupTokens * 4;
constexpr int kStagedSmemBytes = kWarps * kStages * kStageBytes;  // dynamic, fp8 only

// The 32 tokens [t0, t0 + 32) of a group lie in one page; their keys and scales start here.
template <KvDtype D>
__device__ __forceinline__ const uint8_t* page_base_of(const IndexerLogitsParams& p, int64_t page) {
  return p.pool.data + page * index_k_page_bytes(D);
}

// fp8: queues the copies of one group (keys, and the scales by lanes 0-7) into a stage.
__device__ __forceinline__ void stage_group(const uint8_t* page_base, int off0, uint8_t* stage) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    const uint8_t* row = page_base + int64_t(off0 + n * 8 + g) * 128;
#pragma unroll
    for (int u = 0; u < 2; ++u)
      cp_async16(stage + ((n * 2 + u) * 32 + lane) * 16, row + u * 64 + c * 16);
  }
  if (lane < kGroupTokens / 4) {
    cp_async16(stage + kStageKeyBytes + lane * 16,
               page_base + kPageSize * kIndexHeadDim + (off0 + lane * 4) * 4);
  }
}

// One warp, the 32 tokens [t0, t0 + 32) of one page whose raw key pieces are in `keys` (B
// fragments of token off0 + n*8 + g): writes their logits where t < seq_len. scales: the fp8
// tokens' scales, indexed by column.
template <KvDtype D>
__device__ void group_logits(const SharedQuery& s, int m_tiles,
                             const uint4 (&keys)[kNTiles][KeyShape<D>::kLoads], const float* scales,
                             int64_t t0, int64_t seq_len, float* logits) {
  using Shape = KeyShape<D>;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;

  uint2 b[kNTiles][Shape::kKSteps];  // fp8 keys are widened once here, not once per m-tile
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) key_fragments<D>(keys[n], b[n]);

  float sum[kNTiles][2] = {};  // columns n*8 + c*2 + {0,1}, partial over rows g, g+8
  for (int mt = 0; mt < m_tiles; ++mt) {
    float acc[kNTiles][4] = {};
#pragma unroll
    for (int ks = 0; ks < Shape::kKSteps; ++ks) {
      const uint4 a = s.frag[(mt * Shape::kKSteps + ks) * 32 + lane];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) mma<D>(acc[n], a, b[n][ks].x, b[n][ks].y);
    }
    const float w_lo = s.weight[mt * 16 + g], w_hi = s.weight[mt * 16 + g + 8];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sum[n][j] += w_lo * fmaxf(acc[n][j], 0.0f) + w_hi * fmaxf(acc[n][2 + j], 0.0f);
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

// A group whose page id is outside the pool: never read; as the CPU, logits 0 and one error per
// page.
__device__ void bad_page_group(const IndexerLogitsParams& p, int64_t t0, int64_t seq_len,
                               float* logits) {
  const int lane = threadIdx.x % 32;
  if (t0 + lane < seq_len) logits[t0 + lane] = 0.0f;
  if (lane == 0 && t0 % kPageSize == 0 && p.error_count) atomicAdd(p.error_count, 1);
}

template <KvDtype D>
__global__ void __launch_bounds__(kThreads)
    indexer_logits_kernel(IndexerLogitsParams p, int block_tokens) {
  using Shape = KeyShape<D>;
  constexpr bool kStaged = D == KvDtype::kFp8;
  const int row = blockIdx.y;
  // A length past the logits row or the page table is the CPU's error; here it is clamped so
  // nothing outside the row's buffers is touched.
  const int64_t seq_len =
      min(int64_t(p.seq_lens[row]), min(p.ld_logits, p.ld_page_table * kPageSize));
  const int64_t block_t0 = int64_t(blockIdx.x) * block_tokens;
  if (block_t0 >= seq_len) return;  // padded rows and tails cost one load
  const int64_t block_end = min(seq_len, block_t0 + block_tokens);

  __shared__ SharedQuery s;
  __shared__ int32_t block_pages[kMaxBlockTokens / kPageSize];  // the block's page ids
  extern __shared__ __align__(16) uint8_t staged[];             // fp8: [warp][stage][kStageBytes]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* pages = p.page_table + int64_t(row) * p.ld_page_table;
  static_assert(kMaxBlockTokens / kPageSize <= kThreads, "one page id per thread");
  if (threadIdx.x < block_tokens / kPageSize && block_t0 + threadIdx.x * kPageSize < block_end) {
    block_pages[threadIdx.x] = pages[block_t0 / kPageSize + threadIdx.x];
  }
  const int heads_padded = (p.heads + 15) / 16 * 16;
  const int m_tiles = heads_padded / 16;
  prepare_natural<D>(p, row, heads_padded, s);
  __syncthreads();  // block_pages and s.natural are complete

  // This warp's groups: t0 = block_t0 + warp * 32 + i * 256 while t0 < block_end.
  const int64_t warp_t0 = block_t0 + warp * kGroupTokens;
  constexpr int kStride = kWarps * kGroupTokens;
  auto page_of = [&](int64_t t0) { return block_pages[(t0 - block_t0) / kPageSize]; };
  auto valid_page = [&](int32_t page) { return page >= 0 && page < p.pool.num_pages; };
  uint8_t* my_stages = staged + warp * kStages * kStageBytes;
  auto issue = [&](int64_t t0, int i) {  // fp8: the copies of group i, or an empty group
    if (t0 < block_end && valid_page(page_of(t0))) {
      stage_group(page_base_of<D>(p, page_of(t0)), int(t0 % kPageSize),
                  my_stages + (i % kStages) * kStageBytes);
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
    uint4 keys[kNTiles][Shape::kLoads];
    const float* scales = nullptr;
    if constexpr (kStaged) {
      issue(t0 + kStride, i + 1);
      cp_async_wait<1>();  // group i has landed (this lane's copies)
      __syncwarp();        // and every lane's: the scales cross lanes
      if (valid_page(page)) {
        const uint8_t* stage = my_stages + (i % kStages) * kStageBytes;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
          for (int u = 0; u < Shape::kLoads; ++u) {
            keys[n][u] = *reinterpret_cast<const uint4*>(stage + ((n * 2 + u) * 32 + lane) * 16);
          }
        }
        scales = reinterpret_cast<const float*>(stage + kStageKeyBytes);
      }
    } else if (valid_page(page)) {
      const uint8_t* base = page_base_of<D>(p, page);
      const int g = lane / 4, c = lane % 4, off0 = int(t0 % kPageSize);
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const uint8_t* key_row = base + int64_t(off0 + n * 8 + g) * Shape::kRowBytes;
#pragma unroll
        for (int u = 0; u < Shape::kLoads; ++u) {
          keys[n][u] = __ldg(reinterpret_cast<const uint4*>(key_row + u * 64 + c * 16));
        }
      }
    }
    if (valid_page(page)) {
      group_logits<D>(s, m_tiles, keys, scales, t0, seq_len, logits);
    } else {
      bad_page_group(p, t0, seq_len, logits);
    }
    if constexpr (kStaged) __syncwarp();  // every lane is done with stage i before it is reused
  }
}

// Tokens per block: the override, or the largest size that keeps two blocks per SM.
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

}  // namespace

cudaError_t indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.heads <= 0 || p.heads > kMaxHeads || p.rows > 65535 || p.ld_logits <= 0) {
    return cudaErrorInvalidValue;
  }
  const int block_tokens = block_tokens_for(p);
  const dim3 grid(unsigned((p.ld_logits + block_tokens - 1) / block_tokens), unsigned(p.rows));
  if (p.pool.dtype == KvDtype::kBf16) {
    indexer_logits_kernel<KvDtype::kBf16><<<grid, kThreads, 0, stream>>>(p, block_tokens);
  } else {
    const cudaError_t e =
        cudaFuncSetAttribute(indexer_logits_kernel<KvDtype::kFp8>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kStagedSmemBytes);
    if (e != cudaSuccess) return e;
    indexer_logits_kernel<KvDtype::kFp8>
        <<<grid, kThreads, kStagedSmemBytes, stream>>>(p, block_tokens);
  }
  return cudaGetLastError();
}

}  // namespace dsa::cuda
