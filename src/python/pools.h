// The caller's cache pools as dsa sees them: which layout a pool array holds, checked against the
// byte layouts of DESIGN §3 (include/layout/dsa/slot.h), and the PoolView the backend ops take.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "dsa/backend.h"
#include "dsa/ops.h"
#include "dsa/slot.h"
#include "python/array_arg.h"

namespace dsa::py {

// "bf16" | "fp8"; ValueError naming `arg` otherwise.
KvDtype parse_layout(const std::string& layout, const char* arg);

// Checks that `pool` holds a `kind` pool of layout `dtype` and returns its view:
//   index-K bf16  bfloat16 (or uint16 bit patterns) [pages, 64, 128] or [pages * 64, 128]
//   index-K fp8   uint8 [pages, 8448]: per page 64 x 128 e4m3 bytes, then 64 float32 scales
//   latent bf16   bfloat16 (or uint16) [pages, 64, 576] or [pages * 64, 576]
//   latent fp8    uint8 [pages, 64, 656] or [pages * 64, 656]
// C-contiguous, 16-byte aligned, at least two pages (page 0 is reserved).
PoolView pool_view(const ArrayArg& pool, PoolKind kind, KvDtype dtype, bool ue8m0);

// The layout a pool array holds, told by its dtype and last dim (for the auditor, which is handed
// pools of any kind). ValueError when it is none of the four.
struct PoolLayout {
  PoolKind kind;
  KvDtype dtype;
};
PoolLayout infer_pool_layout(const ArrayArg& pool);
std::string pool_layout_label(PoolLayout l);  // "index_k bf16", "latent fp8", ...

// The backend of one call: a borrowed one (the CPU reference, or a CUDA backend kept per thread,
// device and stream: neither holds state between ops) or one made for the call and owned here (a
// CUDA backend on the caller's stream holds the thread's device only while it lives).
class BackendHandle {
 public:
  explicit BackendHandle(Backend* borrowed) : backend_(borrowed) {}
  explicit BackendHandle(std::unique_ptr<Backend> owned)
      : owned_(std::move(owned)), backend_(owned_.get()) {}
  Backend* operator->() const { return backend_; }
  Backend& operator*() const { return *backend_; }

 private:
  std::unique_ptr<Backend> owned_;
  Backend* backend_;
};

// The backend for arrays at `place`: the CPU reference, or the CUDA backend on the caller's
// stream (an integer cudaStream_t handle; 0 is the legacy default stream). A CUDA backend is made
// once per thread, device and stream and reused while its device is the thread's current one (the
// usual case: torch makes the tensors' device current); with another device current, one is made
// for the call that switches to the arrays' device and back.
BackendHandle backend_for(Place place, uintptr_t stream);

}  // namespace dsa::py
