// The CPU reference ops: the executable specification. Scalar, deterministic, one file per op
// family with the same name as its CUDA counterpart.
#pragma once

#include "dsa/ops.h"

namespace dsa::cpu {

void rmsnorm(const RmsNormParams& p);      // norm.cpp
void layernorm(const LayerNormParams& p);  // norm.cpp
void rope(const RopeParams& p);            // rope.cpp
void hadamard(const HadamardParams& p);    // hadamard.cpp
void gemm(const GemmParams& p);            // gemm.cpp
void swiglu(const SwigluParams& p);        // elementwise.cpp
void softmax(const SoftmaxParams& p);      // elementwise.cpp
void embed(const EmbedParams& p);          // elementwise.cpp
void add(const AddParams& p);              // elementwise.cpp

void moe_route(const MoeRouteParams& p);    // moe.cpp
void scale_rows(const ScaleRowsParams& p);  // moe.cpp

void store_index_k(const StoreIndexKParams& p);      // store.cpp
void store_latent_kv(const StoreLatentKvParams& p);  // store.cpp

void indexer_logits(const IndexerLogitsParams& p);  // indexer_logits.cpp
// indexer_query's q_fp8 / q_fp8_scale from its q (after rope and hadamard): indexer_logits.cpp.
void encode_index_query(const IndexerQueryParams& p);
void topk(const TopkParams& p);             // topk.cpp
void sparse_mla(const SparseMlaParams& p);  // sparse_mla.cpp

void audit_slots(const AuditSlotsParams& p);    // audit.cpp
void digest_rows(const DigestRowsParams& p);    // audit.cpp
void audit_sample(const AuditSampleParams& p);  // audit.cpp

void sample(const SampleParams& p);  // sample.cpp

// Row r's `cols` values written into `out` (Fp8Rows, ops.h; checked by require_fp8_rows,
// dsa/backend.h). gemm.cpp.
void encode_fp8_rows(const float* row, int cols, int64_t r, const Fp8Rows& out);

}  // namespace dsa::cpu
