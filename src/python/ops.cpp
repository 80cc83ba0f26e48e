// The backend ops on the caller's arrays: the guarded writers (one per layout, the same judge_slot
// and the same token codec as the C++ runtime), the indexer, top-k and sparse MLA. Every array is
// checked here, then handed to the backend op untouched; CUDA ops run on the caller's stream.
// The user-facing documentation of each lives in python/dsa/__init__.py.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "dsa/backend.h"
#include "python/array_arg.h"
#include "python/bindings.h"
#include "python/pools.h"

namespace dsa::py {
namespace pyb = pybind11;
using namespace pybind11::literals;

namespace {

// A one-element int32 array on the pool's device (n_real, the error counter).
void need_scalar_i32(const ArrayArg& a, const ArrayArg& pool) {
  a.need_dtype({Dtype::kI32}, "(a one-element device scalar)");
  if (a.numel() != 1) {
    throw pyb::value_error(
        fmt::format("argument '{}' must hold exactly one int32; got {}", a.name(), a.describe()));
  }
  a.need_place(pool.place(), pool);
}

// A contiguous 1-D array of `dtype` on the pool's device; returns its length.
int need_vector(const ArrayArg& a, Dtype dtype, const ArrayArg& ref) {
  a.need_dtype({dtype});
  a.need_ndim({1});
  a.need_contiguous();
  a.need_place(ref.place(), ref);
  if (a.dim(0) > INT32_MAX) {
    throw pyb::value_error(fmt::format("argument '{}' has more than 2^31 - 1 rows", a.name()));
  }
  return int(a.dim(0));
}

SlotBatch slot_batch(const ArrayArg& slots, const ArrayArg& n_real, const ArrayArg& errors,
                     const ArrayArg& pool) {
  SlotBatch b;
  b.rows = need_vector(slots, Dtype::kI64, pool);
  need_scalar_i32(n_real, pool);
  need_scalar_i32(errors, pool);
  b.slots = slots.as<int64_t>();
  b.n_real = n_real.as<int32_t>();
  b.error_count = errors.as<int32_t>();
  return b;
}

StoreGuard parse_guard(const std::string& guard, KvDtype layout) {
  if (guard == "contract") return StoreGuard::kEnforced;
  if (guard != "incident") {
    throw pyb::value_error(
        fmt::format("argument 'guard' must be \"contract\" or \"incident\", got \"{}\"", guard));
  }
  if (layout != KvDtype::kBf16) {
    throw pyb::value_error(
        "argument 'guard': \"incident\" reproduces the unguarded bf16 scatter; the fp8 layout has "
        "only the guarded writer");
  }
  return StoreGuard::kIncidentScatter;
}

void store_index_k(pyb::handle pool_obj, pyb::handle slots_obj, pyb::handle k_obj,
                   pyb::handle n_real_obj, pyb::handle errors_obj, const std::string& layout,
                   bool ue8m0, const std::string& guard, std::optional<uintptr_t> stream) {
  const KvDtype dtype = parse_layout(layout, "layout");
  const StoreGuard g = parse_guard(guard, dtype);
  ArrayArg pool(pool_obj, "pool"), slots(slots_obj, "slots"), k(k_obj, "k");
  ArrayArg n_real(n_real_obj, "n_real"), errors(errors_obj, "errors");
  StoreIndexKParams p;
  p.pool = pool_view(pool, PoolKind::kIndexK, dtype, ue8m0);
  p.batch = slot_batch(slots, n_real, errors, pool);
  p.ld_k = need_f32_rows(k, kIndexHeadDim, p.batch.rows, pool);
  p.k = k.as<float>();
  p.guard = g;
  backend_for(pool.place(), caller_stream(stream, pool.place()))->store_index_k(p);
}

void store_latent_kv(pyb::handle pool_obj, pyb::handle slots_obj, pyb::handle latent_obj,
                     pyb::handle k_rope_obj, pyb::handle n_real_obj, pyb::handle errors_obj,
                     const std::string& layout, bool ue8m0, std::optional<uintptr_t> stream) {
  const KvDtype dtype = parse_layout(layout, "layout");
  ArrayArg pool(pool_obj, "pool"), slots(slots_obj, "slots");
  ArrayArg latent(latent_obj, "latent"), k_rope(k_rope_obj, "k_rope");
  ArrayArg n_real(n_real_obj, "n_real"), errors(errors_obj, "errors");
  StoreLatentKvParams p;
  p.pool = pool_view(pool, PoolKind::kLatent, dtype, ue8m0);
  p.batch = slot_batch(slots, n_real, errors, pool);
  p.ld_latent = need_f32_rows(latent, kKvLoraRank, p.batch.rows, pool);
  p.ld_rope = need_f32_rows(k_rope, kRopeDim, p.batch.rows, pool);
  p.latent = latent.as<float>();
  p.k_rope = k_rope.as<float>();
  backend_for(pool.place(), caller_stream(stream, pool.place()))->store_latent_kv(p);
}

// rows x heads x width float32 with packed heads; returns the row stride.
int64_t need_heads(const ArrayArg& a, int64_t width, const ArrayArg& ref) {
  a.need_dtype({Dtype::kF32});
  a.need_ndim({3});
  a.need_place(ref.place(), ref);
  return a.need_rows(width);
}

void indexer_logits(pyb::handle q_obj, pyb::handle w_obj, pyb::handle page_table_obj,
                    pyb::handle seq_lens_obj, pyb::handle pool_obj, pyb::handle logits_obj,
                    const std::string& layout, std::optional<uintptr_t> stream) {
  const KvDtype dtype = parse_layout(layout, "layout");
  ArrayArg q(q_obj, "q"), w(w_obj, "w"), page_table(page_table_obj, "page_table");
  ArrayArg seq_lens(seq_lens_obj, "seq_lens"), pool(pool_obj, "pool"), logits(logits_obj, "logits");
  IndexerLogitsParams p;
  p.pool = pool_view(pool, PoolKind::kIndexK, dtype, false);
  p.ld_q = need_heads(q, kIndexHeadDim, pool);
  p.rows = int(q.dim(0));
  p.heads = int(q.dim(1));
  w.need_dtype({Dtype::kF32});
  w.need_ndim({2});
  w.need_place(pool.place(), pool);
  p.ld_w = w.need_rows(p.heads);
  page_table.need_dtype({Dtype::kI32});
  page_table.need_ndim({2});
  page_table.need_place(pool.place(), pool);
  p.ld_page_table = page_table.need_rows(page_table.dim(1));
  logits.need_dtype({Dtype::kF32});
  logits.need_ndim({2});
  logits.need_place(pool.place(), pool);
  p.ld_logits = logits.need_rows(logits.dim(1));
  const int rows = need_vector(seq_lens, Dtype::kI32, pool);
  for (const ArrayArg* a : {&w, &page_table, &logits}) {
    if (a->dim(0) != p.rows) {
      throw pyb::value_error(fmt::format("argument '{}' needs {} rows like 'q'; got {}", a->name(),
                                         p.rows, a->describe()));
    }
  }
  if (rows != p.rows) {
    throw pyb::value_error(fmt::format("argument 'seq_lens' needs {} rows like 'q'; got {}", p.rows,
                                       seq_lens.describe()));
  }
  p.q = q.as<float>();
  p.w = w.as<float>();
  p.page_table = page_table.as<int32_t>();
  p.seq_lens = seq_lens.as<int32_t>();
  p.logits = logits.as<float>();
  backend_for(pool.place(), caller_stream(stream, pool.place()))->indexer_logits(p);
}

void topk(pyb::handle logits_obj, pyb::handle seq_lens_obj, int k, pyb::handle positions_obj,
          pyb::handle slots_obj, pyb::handle page_table_obj, std::optional<uintptr_t> stream) {
  ArrayArg logits(logits_obj, "logits"), seq_lens(seq_lens_obj, "seq_lens");
  ArrayArg positions(positions_obj, "out_positions");
  if (k <= 0) throw pyb::value_error(fmt::format("argument 'k' must be > 0, got {}", k));
  TopkParams p;
  logits.need_dtype({Dtype::kF32});
  logits.need_ndim({2});
  p.ld_logits = logits.need_rows(logits.dim(1));
  p.rows = need_vector(seq_lens, Dtype::kI32, logits);
  positions.need_dtype({Dtype::kI32});
  positions.need_ndim({2});
  positions.need_contiguous();
  positions.need_place(logits.place(), logits);
  for (const ArrayArg* a : {&logits, &positions}) {
    if (a->dim(0) != p.rows) {
      throw pyb::value_error(fmt::format("argument '{}' needs {} rows like 'seq_lens'; got {}",
                                         a->name(), p.rows, a->describe()));
    }
  }
  positions.need_dim(1, k, "k");
  p.k = k;
  p.logits = logits.as<float>();
  p.seq_lens = seq_lens.as<int32_t>();
  p.out_positions = positions.as<int32_t>();
  if (!slots_obj.is_none()) {
    if (page_table_obj.is_none()) missing("page_table", "out_slots maps through the page table");
    ArrayArg out_slots(slots_obj, "out_slots"), page_table(page_table_obj, "page_table");
    out_slots.need_dtype({Dtype::kI64});
    out_slots.need_ndim({2});
    out_slots.need_contiguous();
    out_slots.need_place(logits.place(), logits);
    out_slots.need_dim(0, p.rows, "rows");
    out_slots.need_dim(1, k, "k");
    page_table.need_dtype({Dtype::kI32});
    page_table.need_ndim({2});
    page_table.need_place(logits.place(), logits);
    page_table.need_dim(0, p.rows, "rows");
    p.ld_page_table = page_table.need_rows(page_table.dim(1));
    p.out_slots = out_slots.as<int64_t>();
    p.page_table = page_table.as<int32_t>();
    backend_for(logits.place(), caller_stream(stream, logits.place()))->topk(p);
    return;
  }
  backend_for(logits.place(), caller_stream(stream, logits.place()))->topk(p);
}

void sparse_mla(pyb::handle q_obj, pyb::handle indices_obj, pyb::handle pool_obj,
                pyb::handle out_obj, float scale, pyb::handle lse_obj, const std::string& layout,
                std::optional<uintptr_t> stream) {
  const KvDtype dtype = parse_layout(layout, "layout");
  ArrayArg q(q_obj, "q"), indices(indices_obj, "indices"), pool(pool_obj, "pool");
  ArrayArg out(out_obj, "out");
  SparseMlaParams p;
  p.pool = pool_view(pool, PoolKind::kLatent, dtype, false);
  p.ld_q = need_heads(q, kLatentDim, pool);
  p.rows = int(q.dim(0));
  p.heads = int(q.dim(1));
  indices.need_dtype({Dtype::kI64});
  indices.need_ndim({2});
  indices.need_place(pool.place(), pool);
  indices.need_dim(0, p.rows, "rows, like q");
  p.ld_indices = indices.need_rows(indices.dim(1));
  p.topk = int(indices.dim(1));
  p.ld_out = need_heads(out, kKvLoraRank, pool);
  out.need_dim(0, p.rows, "rows, like q");
  out.need_dim(1, p.heads, "heads, like q");
  if (!(scale > 0.0f)) {
    throw pyb::value_error(fmt::format("argument 'scale' must be > 0, got {}", scale));
  }
  p.scale = scale;
  p.q = q.as<float>();
  p.indices = indices.as<int64_t>();
  p.out = out.as<float>();
  if (!lse_obj.is_none()) {
    ArrayArg lse(lse_obj, "lse");
    lse.need_dtype({Dtype::kF32});
    lse.need_ndim({2});
    lse.need_contiguous();
    lse.need_place(pool.place(), pool);
    lse.need_dim(0, p.rows, "rows, like q");
    lse.need_dim(1, p.heads, "heads, like q");
    p.lse = lse.as<float>();
    backend_for(pool.place(), caller_stream(stream, pool.place()))->sparse_mla(p);
    return;
  }
  backend_for(pool.place(), caller_stream(stream, pool.place()))->sparse_mla(p);
}

// What an array looks like to dsa, for tests and profiles: how it crossed ("torch" attributes or
// "dlpack"), and the view the checks run on.
pyb::dict array_info(pyb::handle obj, const char* name) {
  const ArrayArg a(obj, name);
  pyb::list shape, strides;
  for (int i = 0; i < a.ndim(); ++i) {
    shape.append(a.dim(i));
    strides.append(a.stride(i));
  }
  return pyb::dict("path"_a = a.from_dlpack() ? "dlpack" : "torch",
                   "dtype"_a = std::string(dtype_label(a.dtype())), "shape"_a = pyb::tuple(shape),
                   "strides"_a = pyb::tuple(strides), "device"_a = a.place().label(),
                   "data"_a = reinterpret_cast<uintptr_t>(a.data()), "describe"_a = a.describe());
}

// The stream an op on `ref` would run on with stream=None.
uintptr_t default_stream(pyb::handle ref) {
  const ArrayArg a(ref, "ref");
  return caller_stream(std::nullopt, a.place());
}

// Reads every argument as an op would and drops the views: the per-array cost, for profiles.
size_t read_arrays(const pyb::args& arrays) {
  for (const pyb::handle a : arrays) ArrayArg(a, "array");
  return arrays.size();
}

}  // namespace

void bind_ops(pyb::module_& m) {
  m.def("array_info", &array_info, "array"_a, "name"_a = "array");
  m.def("default_stream", &default_stream, "ref"_a);
  m.def("read_arrays", &read_arrays);
  m.def("set_torch_attributes", &set_torch_attributes, "enabled"_a);
  m.def("torch_attributes", &torch_attributes);
  m.def("store_index_k", &store_index_k, "pool"_a, "slots"_a, "k"_a, "n_real"_a, "errors"_a,
        "layout"_a, "ue8m0"_a, "guard"_a, "stream"_a);
  m.def("store_latent_kv", &store_latent_kv, "pool"_a, "slots"_a, "latent"_a, "k_rope"_a,
        "n_real"_a, "errors"_a, "layout"_a, "ue8m0"_a, "stream"_a);
  m.def("indexer_logits", &indexer_logits, "q"_a, "w"_a, "page_table"_a, "seq_lens"_a, "pool"_a,
        "logits"_a, "layout"_a, "stream"_a);
  m.def("topk", &topk, "logits"_a, "seq_lens"_a, "k"_a, "out_positions"_a, "out_slots"_a,
        "page_table"_a, "stream"_a);
  m.def("sparse_mla", &sparse_mla, "q"_a, "indices"_a, "pool"_a, "out"_a, "scale"_a, "lse"_a,
        "layout"_a, "stream"_a);
}

}  // namespace dsa::py
