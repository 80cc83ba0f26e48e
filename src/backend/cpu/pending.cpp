// Weak placeholders for reference ops still being written; each real definition overrides one.
// This file is deleted once every op has its implementation.
#include "backend/cpu/cpu_ops.h"
#include "dsa/error.h"

#define DSA_PENDING(name, P) \
  __attribute__((weak)) void name(const P&) { fail(ErrorCode::kInternal, "cpu::" #name " pending"); }

namespace dsa::cpu {
DSA_PENDING(rmsnorm, RmsNormParams)
DSA_PENDING(layernorm, LayerNormParams)
DSA_PENDING(rope, RopeParams)
DSA_PENDING(hadamard, HadamardParams)
DSA_PENDING(gemm, GemmParams)
DSA_PENDING(swiglu, SwigluParams)
DSA_PENDING(softmax, SoftmaxParams)
DSA_PENDING(embed, EmbedParams)
DSA_PENDING(add, AddParams)
DSA_PENDING(store_index_k, StoreIndexKParams)
DSA_PENDING(store_latent_kv, StoreLatentKvParams)
DSA_PENDING(indexer_logits, IndexerLogitsParams)
DSA_PENDING(topk, TopkParams)
DSA_PENDING(sparse_mla, SparseMlaParams)
}  // namespace dsa::cpu
