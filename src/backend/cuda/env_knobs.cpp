#include "backend/cuda/env_knobs.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dsa/backend.h"
#include "dsa/error.h"

namespace dsa::cuda {

const std::vector<EnvKnob>& env_knobs() {
  static const std::vector<EnvKnob> knobs = {
      {kSparseMlaKernelVar.data(),
       {kSparseMlaKernels.begin(), kSparseMlaKernels.end()},
       "the sparse MLA kernel (default: ws for bf16 and fp8 caches; wgmma: the former fp8 "
       "default; hn: heads as the MMA's N, for small batches; the others differ in bits)"},
      {kSparseMlaSplitsVar.data(),
       {kSparseMlaSplitBounds.begin(), kSparseMlaSplitBounds.end()},
       "the bound on splits per row (default: 4; 8 for single-stream latency, 1 or 2 for large "
       "batches)"},
      {"DSA_CUDA_SPARSE_MLA_HEADS",
       {"auto", "16", "32", "64"},
       "heads per CTA (default and auto: chosen from the batch, the fewest that fit one wave; "
       "16, 32 or 64 forced; the same bits)"},
      {"DSA_CUDA_SPARSE_MLA_WGMMA_PV",
       {"wgmma", "mma"},
       "P V in the wgmma kernel (default: wgmma; mma is a check path with other bits)"},
      {"DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE",
       {"serial", "overlap"},
       "the wgmma kernel's token loop (default: serial; the same bits)"},
      {"DSA_CUDA_SPARSE_MLA_Q",
       {"cluster", "l2"},
       "where ws's CTAs get q (default: l2, each copies its own where rows are 16-byte aligned; "
       "cluster: each loads a share and stores it into the others; the same bits)"},
      {"DSA_CUDA_INDEXER_VARIANT",
       {"legacy", "resident", "wgmma", "wgmma-n64", "wgmma-pipe", "wgmma-e4m3"},
       "the indexer kernel (default: wgmma for bf16 caches, wgmma-e4m3 for fp8)"},
      {"DSA_CUDA_INDEXER_Q",
       {"encode", "given"},
       "where the fp8 indexer kernel (wgmma-e4m3) gets the query's encoding (default: encode, "
       "every block encodes it; given: the one indexer_query wrote; the same bits)"},
      {"DSA_CUDA_INDEXER_BLOCK_TOKENS",
       {"128", "256", "512", "1024", "2048", "4096", "8192"},
       "the indexer's tokens per block (default: from the batch; the same bits; the legacy and "
       "resident variants ignore 128 and 256)"},
      {"DSA_CUDA_INDEXER_TILES",
       {"interleaved", "contiguous"},
       "how the wgmma indexer kernels' blocks share a row's tiles (default: interleaved, block x "
       "of G takes tiles x, x + G, ..., so a row shorter than the cache's capacity still spreads "
       "over every block; contiguous: each block a span of its row; the same bits)"},
      {"DSA_CUDA_INDEXER_RING",
       {"auto", "6", "9", "17"},
       "the fp8 indexer kernel's (wgmma-e4m3) ring of copies per block (auto, the default: 9 "
       "where 6 would take more than one wave of the GPU, else 6; 6: 6 stages, three blocks per "
       "SM; 9: two per SM, 17: one, each with blocks sized to fill the GPU once unless "
       "DSA_CUDA_INDEXER_BLOCK_TOKENS is set; the same bits)"},
      {"DSA_CUDA_INDEXER_CLUSTER",
       {"1", "2", "4"},
       "the resident indexer's blocks per cluster (default: from the block size)"},
      {"DSA_CUDA_PDL",
       {"off", "on"},
       "programmatic dependent launch: each kernel launched while the one before it finishes "
       "(default: off; the same bits)"},
      {"DSA_CUDA_TOPK",
       {"legacy"},
       "the former three-pass top-k (default: unset, the two-pass one)"},
      {"DSA_CUDA_GEMM_REDUCE",
       {"auto", "cluster", "global"},
       "the invariant GEMM's split-K reduction (default: auto, the slices' CTAs of an output tile "
       "sum in distributed shared memory where the kernel allows and it pays, else through L2; "
       "cluster: wherever the kernel allows; global: through L2, the last CTA or a separate "
       "kernel; the same bits; read when the backend is made)"},
      {"DSA_CUDA_LANES",
       {"off", "on"},
       "the side lane (Backend::set_lane) on a second stream, a parallel branch of a captured "
       "step: the indexer beside the query projections (default: on; off runs every op in "
       "program order on one stream; the same bits; read when the backend is made)"},
  };
  return knobs;
}

const std::vector<std::string>& gemm_env_knob_names() {
  static const std::vector<std::string> names = {"DSA_CUDA_GEMM", "DSA_CUDA_GEMM_FP8",
                                                 "DSA_CUDA_GEMM_FP8_TILE", "DSA_CUDA_GEMM_KN"};
  return names;
}

bool lanes_enabled() {
  const char* v = std::getenv("DSA_CUDA_LANES");
  return v == nullptr || std::strcmp(v, "off") != 0;
}

bool indexer_reads_given_query() {
  const char* v = std::getenv("DSA_CUDA_INDEXER_Q");
  return v != nullptr && std::strcmp(v, "given") == 0;
}

bool indexer_interleaves_tiles() {
  const char* v = std::getenv("DSA_CUDA_INDEXER_TILES");
  return v == nullptr || std::strcmp(v, "contiguous") != 0;
}

std::string env_knobs_set() {
  std::string set;
  auto add = [&](const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return;
    set += (set.empty() ? "" : ", ") + std::string(name) + "=" + v;
  };
  for (const EnvKnob& knob : env_knobs()) add(knob.name);
  for (const std::string& name : gemm_env_knob_names()) add(name.c_str());
  return set;
}

void check_env_knobs() {
  for (const EnvKnob& knob : env_knobs()) {
    const char* v = std::getenv(knob.name);
    if (v == nullptr || *v == '\0') continue;
    if (std::find(knob.values.begin(), knob.values.end(), v) != knob.values.end()) continue;
    std::string list;
    for (const std::string& value : knob.values) list += (list.empty() ? "" : ", ") + value;
    fail(ErrorCode::kInvalidArgument, "{} '{}' must be one of {} (unset: {})", knob.name, v, list,
         knob.what);
  }
}

}  // namespace dsa::cuda
