#include "python/pools.h"

#include <fmt/format.h>

#include <vector>

namespace dsa::py {
namespace pyb = pybind11;

KvDtype parse_layout(const std::string& layout, const char* arg) {
  if (layout == "bf16") return KvDtype::kBf16;
  if (layout == "fp8") return KvDtype::kFp8;
  throw pyb::value_error(
      fmt::format("argument '{}' must be \"bf16\" or \"fp8\", got \"{}\"", arg, layout));
}

namespace {

// Bytes of one token and the element width of each layout's array.
int64_t token_elems(PoolKind kind, KvDtype dtype) {
  if (kind == PoolKind::kIndexK) return dtype == KvDtype::kBf16 ? kIndexHeadDim : kIndexHeadDim + 4;
  return dtype == KvDtype::kBf16 ? kLatentDim : kLatentFp8TokenBytes;
}

const char* kind_label(PoolKind kind) { return kind == PoolKind::kIndexK ? "index_k" : "latent"; }

}  // namespace

std::string pool_layout_label(PoolLayout l) {
  return fmt::format("{} {}", kind_label(l.kind), kv_dtype_name(l.dtype));
}

PoolView pool_view(const ArrayArg& pool, PoolKind kind, KvDtype dtype, bool ue8m0) {
  if (dtype == KvDtype::kBf16) {
    pool.need_dtype({Dtype::kBf16, Dtype::kU16},
                    "(uint16 is read as bf16 bit patterns) for a bf16 pool");
  } else {
    pool.need_dtype({Dtype::kU8}, "for an fp8 pool (its pages mix e4m3 bytes and float32 scales)");
  }
  const int64_t page_bytes =
      kind == PoolKind::kIndexK ? index_k_page_bytes(dtype) : latent_page_bytes(dtype);
  int64_t pages = 0;
  if (kind == PoolKind::kIndexK && dtype == KvDtype::kFp8) {
    pool.need_ndim({2});
    pool.need_dim(1, page_bytes, "bytes per fp8 index-K page: 64 x 128 e4m3, then 64 scales");
    pages = pool.dim(0);
  } else {
    const int64_t width = token_elems(kind, dtype);
    pool.need_ndim({2, 3});
    // The layout's label names the width in a message; built only for one.
    auto need_width = [&](int dim) {
      if (pool.dim(dim) != width) {
        pool.need_dim(dim, width, pool_layout_label({kind, dtype}).c_str());
      }
    };
    if (pool.ndim() == 3) {
      pool.need_dim(1, kPageSize, "tokens per page");
      need_width(2);
      pages = pool.dim(0);
    } else {
      need_width(1);
      if (pool.dim(0) % kPageSize != 0) {
        throw pyb::value_error(fmt::format(
            "argument '{}' has {} token rows; a {} pool needs a whole number of 64-token pages",
            pool.name(), pool.dim(0), pool_layout_label({kind, dtype})));
      }
      pages = pool.dim(0) / kPageSize;
    }
  }
  pool.need_contiguous();
  pool.need_aligned(16);
  if (pages < 2) {
    throw pyb::value_error(fmt::format(
        "argument '{}' holds {} page(s); a pool needs page 0 (reserved) and at least one more",
        pool.name(), pages));
  }
  PoolView v;
  v.data = pool.as<uint8_t>();
  v.dtype = dtype;
  v.rounding = ue8m0 ? ScaleRounding::kUe8m0 : ScaleRounding::kExact;
  v.num_pages = pages;
  return v;
}

PoolLayout infer_pool_layout(const ArrayArg& pool) {
  const int64_t last = pool.ndim() >= 1 ? pool.dim(pool.ndim() - 1) : 0;
  const bool wide = pool.dtype() == Dtype::kBf16 || pool.dtype() == Dtype::kU16;
  if (wide && last == kIndexHeadDim) return {PoolKind::kIndexK, KvDtype::kBf16};
  if (wide && last == kLatentDim) return {PoolKind::kLatent, KvDtype::kBf16};
  if (pool.dtype() == Dtype::kU8 && last == index_k_page_bytes(KvDtype::kFp8)) {
    return {PoolKind::kIndexK, KvDtype::kFp8};
  }
  if (pool.dtype() == Dtype::kU8 && last == kLatentFp8TokenBytes) {
    return {PoolKind::kLatent, KvDtype::kFp8};
  }
  throw pyb::value_error(fmt::format(
      "argument '{}' is no dsa pool: expected bf16/uint16 [..., 128] (index_k bf16), uint8 "
      "[pages, 8448] (index_k fp8), bf16/uint16 [..., 576] (latent bf16) or uint8 [..., 656] "
      "(latent fp8); got {}",
      pool.name(), pool.describe()));
}

namespace {

// The on-stream CUDA backends of one thread, one per (device, stream) it has run ops on, each made
// while its device was current (so it switches no device and holds nothing but the stream handle).
// An engine uses a few streams; past kMax the oldest entry goes.
class StreamBackends {
 public:
  Backend* get(int device, uintptr_t stream) {
    for (const Entry& e : entries_) {
      if (e.device == device && e.stream == stream) return e.backend.get();
    }
    if (entries_.size() == kMax) entries_.erase(entries_.begin());
    entries_.push_back({device, stream, make_cuda_backend_on_stream(device, stream)});
    return entries_.back().backend.get();
  }

 private:
  static constexpr size_t kMax = 16;
  struct Entry {
    int device;
    uintptr_t stream;
    std::unique_ptr<Backend> backend;
  };
  std::vector<Entry> entries_;
};

}  // namespace

BackendHandle backend_for(Place place, uintptr_t stream) {
  if (place.cuda()) {
    thread_local StreamBackends kept;
    if (cuda_current_device() == place.id) return BackendHandle(kept.get(place.id, stream));
    // Another device is current: a backend for this op alone, which switches to the arrays'
    // device and back.
    return BackendHandle(make_cuda_backend_on_stream(place.id, stream));
  }
  thread_local const std::unique_ptr<Backend> cpu = make_cpu_backend();
  return BackendHandle(cpu.get());
}

}  // namespace dsa::py
