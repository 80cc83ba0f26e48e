// Weak placeholders for CUDA launchers still being written; each real definition overrides one.
// This file is deleted once every launcher has its kernel.
#include "backend/cuda/launch.h"

#define DSA_PENDING(name, P) \
  __attribute__((weak)) cudaError_t name(const P&, cudaStream_t) { return cudaErrorNotSupported; }

namespace dsa::cuda {
DSA_PENDING(rmsnorm, RmsNormParams)
DSA_PENDING(layernorm, LayerNormParams)
DSA_PENDING(rope, RopeParams)
DSA_PENDING(hadamard, HadamardParams)
DSA_PENDING(gemm_invariant, GemmParams)
DSA_PENDING(swiglu, SwigluParams)
DSA_PENDING(softmax, SoftmaxParams)
DSA_PENDING(embed, EmbedParams)
DSA_PENDING(add, AddParams)
DSA_PENDING(store_index_k, StoreIndexKParams)
DSA_PENDING(store_latent_kv, StoreLatentKvParams)
DSA_PENDING(indexer_logits, IndexerLogitsParams)
DSA_PENDING(topk, TopkParams)
DSA_PENDING(sparse_mla, SparseMlaParams)
}  // namespace dsa::cuda
