// Token sampling on the GPU, the same draws as cpu/sample.cpp: dsa/sampling.h holds the shared
// arithmetic, and every sum that decides a token is an integer sum, so the parallel order here
// gives the CPU loop's bits.
//
// One kernel, capturable in the step's graph, grid (chunks, rows), chunks of 4096 logits fixed by
// the vocabulary alone:
//   1. every CTA finds its chunk's best (value, lowest id) and publishes it; the row's counter
//      counts the chunks done, and the CTA that finishes the row's last chunk carries on (it
//      resets the counter to zero, so the next launch finds it so);
//   2. that CTA takes the row's best over the chunk partials, in chunk order. A greedy row stops
//      there. A row that draws computes its integer weights over the whole vocabulary into the
//      workspace (their sum in any order is exact), cuts the nucleus by an MSB radix select over
//      them (8-bit digits; each bin sums weights, warp-aggregated before the shared atomic) and
//      draws by an ordered scan in id order. For log-probs it sums e^(l - top) in double in a
//      fixed order (thread-strided, then warp butterflies, then warps in order): within rounding
//      of the CPU's loop.
// A row reads only its own logits, parameters and workspace rows: batch-invariant. The workspace
// must be zero when first allocated (Backend::sample_workspace_bytes); every launch leaves its
// counters zero again.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.h"
#include "dsa/sampling.h"

namespace dsa::cuda {
namespace {

constexpr int kChunk = 4096, kThreads = 512;
constexpr int kMaxRows = 65535;  // the grid's y limit

struct Workspace {
  uint32_t* counters;  // [kMaxRows] chunks done per row; zero between launches
  float* chunk_max;    // [rows, chunks]
  int32_t* chunk_arg;  // [rows, chunks]
  uint32_t* weights;   // [rows, ld_weights]
  int chunks;
  int64_t ld_weights;
};

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Carves the workspace out of `base` (null: only sizes it); returns its bytes. The counters come
// first and have a size of their own, so a launch with fewer rows finds them where a launch with
// more left them (zero).
size_t carve(void* base, int rows, int vocab, Workspace* ws) {
  const int chunks = int(ceil_div(vocab, kChunk));
  const int64_t ld = (int64_t(vocab) + 63) / 64 * 64;
  const size_t partials = size_t(rows) * size_t(chunks);
  const size_t sizes[4] = {size_t(kMaxRows) * sizeof(uint32_t), partials * sizeof(float),
                           partials * sizeof(int32_t),
                           size_t(rows) * size_t(ld) * sizeof(uint32_t)};
  size_t offsets[4], at = 0;
  for (int i = 0; i < 4; ++i) offsets[i] = at, at += align256(sizes[i]);
  if (ws) {
    char* b = static_cast<char*>(base);
    *ws = {reinterpret_cast<uint32_t*>(b + offsets[0]),
           reinterpret_cast<float*>(b + offsets[1]),
           reinterpret_cast<int32_t*>(b + offsets[2]),
           reinterpret_cast<uint32_t*>(b + offsets[3]),
           chunks,
           ld};
  }
  return at;
}

// ---- argmax: the largest non-NaN value, ties to the lower id; id -1 for "none yet" ----

struct Best {
  float v;
  int32_t i;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  if (a.v != b.v) return a.v > b.v ? a : b;
  return a.i < b.i ? a : b;
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Best o{__shfl_xor_sync(kFullMask, b.v, offset), __shfl_xor_sync(kFullMask, b.i, offset)};
    b = better(b, o);
  }
  return b;
}

// The row's best over its chunk partials (the maximum with its tie rule: any order gives it),
// computed by warp 0 into *out (the caller syncs). The partials come from other CTAs: read
// through L2.
__device__ void row_best(const Workspace& ws, int row, Best* out) {
  if (threadIdx.x >= 32) return;
  Best b{0.0f, -1};
  const int64_t at = int64_t(row) * ws.chunks;
  for (int c = threadIdx.x; c < ws.chunks; c += 32)
    b = better(b, {__ldcg(ws.chunk_max + at + c), __ldcg(ws.chunk_arg + at + c)});
  b = warp_best(b);
  if (threadIdx.x == 0) *out = b;
}

__device__ __forceinline__ bool is_infinite(float v) { return v == INFINITY || v == -INFINITY; }

// ---- the draw ----

struct DrawShared {
  unsigned long long hist[256];
  unsigned long long warp_sums[kThreads / 32];
  double warp_e[kThreads / 32];
  Best warp_best[kThreads / 32];
  unsigned long long total, above, bin;
  double e_sum;
  uint32_t digit;
  int32_t token;
  Best best;
  bool last;
};

// Exclusive prefix sum of v in thread order (the block's threads, all of them calling).
__device__ unsigned long long block_exclusive_scan(unsigned long long v, DrawShared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long incl = v;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long o = __shfl_up_sync(kFullMask, incl, offset);
    if (lane >= offset) incl += o;
  }
  if (lane == 31) s.warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    unsigned long long t = lane < kThreads / 32 ? s.warp_sums[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const unsigned long long o = __shfl_up_sync(kFullMask, t, offset);
      if (lane >= offset) t += o;
    }
    if (lane < kThreads / 32) s.warp_sums[lane] = t;  // inclusive over warps
  }
  __syncthreads();
  const unsigned long long before = warp == 0 ? 0 : s.warp_sums[warp - 1];
  __syncthreads();  // warp_sums is reused by the next scan
  return before + incl - v;
}

// The nucleus cut: the largest weight c with sum(w >= c) >= need, by four 8-bit digit passes from
// the top. Returns c; s.above + s.bin is then sum(w >= c), the nucleus's mass.
__device__ uint32_t radix_cut(const uint32_t* w, int vocab, unsigned long long need,
                              DrawShared& s) {
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0;
  unsigned long long above = 0;  // weight of every key above the current prefix's range
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    const uint32_t high = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);
    for (int base = 0; base < vocab; base += kThreads) {
      const int i = base + threadIdx.x;
      const uint32_t k = i < vocab ? w[i] : 0u;
      const bool in = k != 0 && (k & high) == prefix;
      const uint32_t digit = in ? (k >> shift) & 255u : 256u;
      const unsigned group = __match_any_sync(kFullMask, digit);
      // Weights are < 2^32, so split them to keep 32 lanes' sums inside 32 bits.
      const uint32_t hi = __reduce_add_sync(group, in ? k >> 16 : 0u);
      const uint32_t lo = __reduce_add_sync(group, in ? k & 0xFFFFu : 0u);
      if (in && lane == __ffs(group) - 1) {
        atomicAdd(&s.hist[digit], (static_cast<unsigned long long>(hi) << 16) + lo);
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane l holds digits 255 - 8l down to 248 - 8l
      unsigned long long local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) local += s.hist[255 - 8 * lane - j];
      unsigned long long incl = local;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const unsigned long long o = __shfl_up_sync(kFullMask, incl, offset);
        if (lane >= offset) incl += o;
      }
      unsigned long long acc = above + incl - local;
      if (acc < need && above + incl >= need) {  // exactly one lane
        for (int j = 0; j < 8; ++j) {
          const uint32_t d = 255u - 8u * lane - j;
          if (acc + s.hist[d] >= need) {
            s.digit = d;
            s.above = acc;
            s.bin = s.hist[d];
            break;
          }
          acc += s.hist[d];
        }
      }
    }
    __syncthreads();
    prefix |= s.digit << shift;
    above = s.above;
    __syncthreads();  // s.digit and s.above are rewritten by the next pass
  }
  return prefix;
}

// The integer weights of a drawing row into w (and their sum into s.total), and for log-probs the
// sum of e^(l - top) into s.e_sum, in the fixed order described at the top.
__device__ void row_weights(const SampleParams& p, const float* l, int row, float top, bool draws,
                            bool logprob, uint32_t* w, DrawShared& s) {
  const float temperature = p.temperature[row];
  unsigned long long w_sum = 0;
  double e_sum = 0.0;
  for (int i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = l[i];
    if (draws) {
      const uint32_t weight = sample_weight(v, top, temperature);
      w[i] = weight;
      w_sum += weight;
    }
    if (logprob && v == v) e_sum = __dadd_rn(e_sum, sample_exp(double(v) - double(top)));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    w_sum += __shfl_xor_sync(kFullMask, w_sum, offset);
    e_sum = __dadd_rn(e_sum, __shfl_xor_sync(kFullMask, e_sum, offset));
  }
  if (threadIdx.x % 32 == 0)
    s.warp_sums[threadIdx.x / 32] = w_sum, s.warp_e[threadIdx.x / 32] = e_sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < kThreads / 32; ++k)
      w_sum += s.warp_sums[k], e_sum = __dadd_rn(e_sum, s.warp_e[k]);
    s.total = w_sum;
    s.e_sum = e_sum;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p, Workspace ws) {
  pdl_enter();
  __shared__ DrawShared s;
  const int row = blockIdx.y, chunk = blockIdx.x;
  const float* l = p.logits + int64_t(row) * p.ld_logits;

  // 1. This chunk's best, published; the last chunk of the row to finish goes on.
  {
    const int begin = chunk * kChunk, end = min(p.vocab, begin + kChunk);
    Best b{0.0f, -1};
#pragma unroll 8
    for (int i = begin + threadIdx.x; i < end; i += kThreads) {
      const float v = l[i];
      if (v == v) b = better(b, {v, i});
    }
    b = warp_best(b);
    if (threadIdx.x % 32 == 0) s.warp_best[threadIdx.x / 32] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < kThreads / 32; ++k) b = better(b, s.warp_best[k]);
      const int64_t at = int64_t(row) * ws.chunks + chunk;
      ws.chunk_max[at] = b.v;
      ws.chunk_arg[at] = b.i;
      __threadfence();  // the partial is visible before the count says so
      const uint32_t done = atomicAdd(ws.counters + row, 1u);
      s.last = done == uint32_t(ws.chunks - 1);
      if (s.last) ws.counters[row] = 0;  // every chunk has counted: ready for the next launch
    }
    __syncthreads();
    if (!s.last) return;
    __threadfence();
  }

  // 2. The row, by the CTA of its last chunk.
  row_best(ws, row, &s.best);
  __syncthreads();
  const Best best = s.best;
  const bool finite = best.i >= 0 && !is_infinite(best.v);
  const bool draws = finite && !sample_is_greedy(p.temperature[row]);
  const bool logprob = p.logprobs != nullptr && finite;
  if (threadIdx.x == 0) s.token = best.i;
  uint32_t* w = ws.weights + int64_t(row) * ws.ld_weights;
  if (draws || logprob) row_weights(p, l, row, best.v, draws, logprob, w, s);
  if (draws) {
    const uint32_t cut = radix_cut(w, p.vocab, sample_need(s.total, p.top_p[row]), s);
    const unsigned long long mass = s.above + s.bin;
    const unsigned long long target =
        sample_target(sample_uniform(p.seed[row], p.index[row]), mass);
    // Each thread owns a run of ids; a scan of the runs' nucleus weights finds the run, and its
    // thread walks it.
    const int run = (p.vocab + kThreads - 1) / kThreads;
    const int begin = threadIdx.x * run, end = min(p.vocab, begin + run);
    unsigned long long own = 0;
    for (int i = begin; i < end; ++i) own += w[i] >= cut ? w[i] : 0u;
    const unsigned long long before = block_exclusive_scan(own, s);
    if (before <= target && target < before + own) {
      unsigned long long running = before;
      for (int i = begin; i < end; ++i) {
        if (w[i] < cut) continue;
        running += w[i];
        if (target < running) {
          s.token = i;
          break;
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  p.tokens[row] = s.token;
  if (!p.logprobs) return;
  if (best.i < 0) {
    p.logprobs[row] = __int_as_float(0x7fc00000);  // the CPU's quiet NaN
  } else if (is_infinite(best.v)) {
    p.logprobs[row] = 0.0f;
  } else {
    p.logprobs[row] = float(-log(s.e_sum) + (double(l[s.token]) - double(best.v)));
  }
}

}  // namespace

size_t sample_workspace_bytes(int rows, int vocab) {
  return rows > 0 && vocab > 0 ? carve(nullptr, rows, vocab, nullptr) : 0;
}

cudaError_t sample(const SampleParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab < 1 || p.vocab > kMaxSampleVocab || p.ld_logits < p.vocab ||
      p.rows > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (!p.logits || !p.temperature || !p.top_p || !p.seed || !p.index || !p.tokens || !p.workspace) {
    return cudaErrorInvalidValue;
  }
  Workspace ws;
  carve(p.workspace, p.rows, p.vocab, &ws);
  const dim3 grid(unsigned(ws.chunks), unsigned(p.rows));
  launch_kernel(sample_kernel, grid, kThreads, 0, stream, p, ws);
  return cudaGetLastError();
}

}  // namespace dsa::cuda
