// The floor of the sparse MLA split combine's data movement (bench_util.h declares the entry; this
// file does not include it: nvcc need not parse nlohmann/json). A cluster of 8 CTAs of 256
// threads, one per SM, each holding a 64 x 512 f32 partial in shared memory (the 64-head
// kernels' partial o), leaves CTA r with the 8 partials' sum over output dims [64 r, 64 r + 64),
// moved one of three ways:
//   pull:   each CTA loads its slice of every partial from the other CTAs' shared memory (the
//           kernels' combine: float4 loads, two batches of 16 per thread);
//   push:   each CTA stores its partial's slices into their owners' shared memory (the values
//           already in registers, as the kernels hold o), then each owner sums locally;
//   global: each CTA stores its partial to global memory (L2), then loads its slice of every
//           partial from there.
// Timed per CTA from a cluster barrier to the cluster barrier after the sums (clock64, scaled
// by globaltimer), so it counts what the kernels would pay after their token loop.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace cg = cooperative_groups;

namespace dsa::bench {

// As declared in bench_util.h.
struct ClusterExchangeResult {
  double cta_us = 0, cta_cycles = 0, launch_us = 0;
  int ctas = 0, sms = 0;
};

namespace {

constexpr int kSplits = 8, kThreads = 256, kHeads = 64, kDims = 512;
constexpr int kPitch = kDims + 8;                      // the kernels' partial pitch (f32)
constexpr int kSlice = kDims / kSplits;                // 64 dims a CTA owns
constexpr int kVecs = kSlice / 4;                      // float4s per head of a slice
constexpr int kIters = kHeads * kVecs / kThreads;      // 4 items per thread per partial
constexpr size_t kSmem = size_t(kHeads) * kPitch * 4;  // 133,120 B
constexpr int kWords = 4;                              // per CTA: cycles, ns, start ns, smid

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The sum of this thread's float4s of every split's slice (the combine's reads: two batches of
// 2 items x 8 splits, each batch's loads issued before the first is used); load(s, h, d).
template <class Load>
__device__ __forceinline__ float sum_slices(int t, int rank, Load load) {
  float acc = 0.0f;
#pragma unroll
  for (int i0 = 0; i0 < kIters; i0 += 2) {
    float4 v[2][kSplits];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int it = t + (i0 + i) * kThreads, h = it / kVecs, d = rank * kSlice + (it % kVecs) * 4;
#pragma unroll
      for (int s = 0; s < kSplits; ++s) v[i][s] = load(s, h, d);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int s = 0; s < kSplits; ++s) acc += v[i][s].x + v[i][s].y + v[i][s].z + v[i][s].w;
    }
  }
  return acc;
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 1)
    exchange_kernel(float* ws, float* sink, uint64_t* times) {
  extern __shared__ __align__(16) float part[];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), t = int(threadIdx.x);
  for (int i = t; i < kHeads * kPitch; i += kThreads) part[i] = float((i * 7 + rank) & 1023);
  __syncthreads();
  // push: this thread's values of every owner's slice, in registers before the clock starts.
  float4 mine[kSplits][kIters];
  if constexpr (kMode == 1) {
#pragma unroll
    for (int r = 0; r < kSplits; ++r) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int it = t + i * kThreads, h = it / kVecs, d = r * kSlice + (it % kVecs) * 4;
        mine[r][i] = *reinterpret_cast<const float4*>(part + h * kPitch + d);
      }
    }
  }
  cluster.sync();
  const uint64_t c0 = clock64(), n0 = now_ns();
  float acc = 0.0f;
  if constexpr (kMode == 0) {  // pull
    acc = sum_slices(t, rank, [&](int s, int h, int d) {
      return *reinterpret_cast<const float4*>(cluster.map_shared_rank(part, s) + h * kPitch + d);
    });
  } else if constexpr (kMode == 1) {
    // push: owner r keeps split s's slice at dims [64 s, 64 s + 64)
#pragma unroll
    for (int r = 0; r < kSplits; ++r) {
      float* dst = cluster.map_shared_rank(part, r);
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int it = t + i * kThreads, h = it / kVecs, d = rank * kSlice + (it % kVecs) * 4;
        *reinterpret_cast<float4*>(dst + h * kPitch + d) = mine[r][i];
      }
    }
    cluster_barrier();
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int it = t + i * kThreads, h = it / kVecs, dd = (it % kVecs) * 4;
#pragma unroll
      for (int s = 0; s < kSplits; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(part + h * kPitch + s * kSlice + dd);
        acc += v.x + v.y + v.z + v.w;
      }
    }
  } else {  // global
    float* mine_ws = ws + size_t(blockIdx.x) * kHeads * kDims;
    for (int i = t; i < kHeads * kDims / 4; i += kThreads) {
      const int h = i / (kDims / 4), d = (i % (kDims / 4)) * 4;
      *reinterpret_cast<float4*>(mine_ws + h * kDims + d) =
          *reinterpret_cast<const float4*>(part + h * kPitch + d);
    }
    cluster_barrier();  // release / acquire at cluster scope: the partials in L2 are visible
    const float* base = ws + size_t(blockIdx.x - rank) * kHeads * kDims;
    acc = sum_slices(t, rank, [&](int s, int h, int d) {
      return __ldcg(
          reinterpret_cast<const float4*>(base + size_t(s) * kHeads * kDims + h * kDims + d));
    });
  }
  cluster_barrier();  // no CTA leaves while another reads or writes its shared memory
  sink[size_t(blockIdx.x) * kThreads + t] = acc;
  if (t == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    uint64_t* w = times + size_t(blockIdx.x) * kWords;
    w[0] = clock64() - c0, w[1] = now_ns() - n0, w[2] = n0, w[3] = sm;
  }
}

using Kernel = void (*)(float*, float*, uint64_t*);

}  // namespace

// mode 0 pull, 1 push, 2 global; `clusters` clusters of 8 CTAs on `stream` (synchronized).
cudaError_t run_cluster_exchange(int mode, int clusters, cudaStream_t stream,
                                 ClusterExchangeResult& out) {
  const Kernel kernels[] = {exchange_kernel<0>, exchange_kernel<1>, exchange_kernel<2>};
  if (mode < 0 || mode > 2 || clusters <= 0) return cudaErrorInvalidValue;
  const Kernel kernel = kernels[mode];
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
  if (err != cudaSuccess) return err;
  const int ctas = clusters * kSplits;
  float *ws = nullptr, *sink = nullptr;
  uint64_t* times = nullptr;
  const size_t ws_floats = mode == 2 ? size_t(ctas) * kHeads * kDims : 4;
  if ((err = cudaMalloc(&ws, ws_floats * 4)) != cudaSuccess) return err;
  if ((err = cudaMalloc(&sink, size_t(ctas) * kThreads * 4)) != cudaSuccess) return err;
  if ((err = cudaMalloc(&times, size_t(ctas) * kWords * 8)) != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(ctas));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = kSplits;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  std::vector<uint64_t> w(size_t(ctas) * kWords);
  for (int rep = 0; rep < 3 && err == cudaSuccess; ++rep) {  // the last launch is kept
    err = cudaLaunchKernelEx(&config, kernel, ws, sink, times);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpy(w.data(), times, w.size() * 8, cudaMemcpyDeviceToHost);
  }
  cudaFree(ws);
  cudaFree(sink);
  cudaFree(times);
  if (err != cudaSuccess) return err;
  double cycles = 0, ns = 0;
  uint64_t first = UINT64_MAX, last = 0;
  std::vector<bool> used(4096, false);
  int sms = 0;
  for (int c = 0; c < ctas; ++c) {
    const uint64_t* v = w.data() + size_t(c) * kWords;
    cycles += double(v[0]), ns += double(v[1]);
    first = v[2] < first ? v[2] : first;
    last = v[2] + v[1] > last ? v[2] + v[1] : last;
    if (v[3] < used.size() && !used[v[3]]) used[v[3]] = true, ++sms;
  }
  out.ctas = ctas, out.sms = sms;
  out.cta_cycles = cycles / ctas;
  out.cta_us = ns * 1e-3 / ctas;
  out.launch_us = double(last - first) * 1e-3;
  return cudaSuccess;
}

}  // namespace dsa::bench
