// The backend ops on the caller's arrays: the indexer, top-k and sparse MLA (the guarded writers
// are in stores.cpp). Every array is checked here, then handed to the backend op untouched; CUDA
// ops run on the caller's stream.
// The user-facing documentation of each lives in python/dsa/__init__.py.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>

#include "dsa/backend.h"
#include "python/array_arg.h"
#include "python/bindings.h"
#include "python/pools.h"

namespace dsa::py {
namespace pyb = pybind11;
using namespace pybind11::literals;

namespace {

// rows x heads x width float32 with packed heads; returns the row stride.
int64_t need_heads(const ArrayArg& a, int64_t width, const ArrayArg& ref) {
  a.need_dtype({Dtype::kF32});
  a.need_ndim({3});
  a.need_place(ref.place(), ref);
  return a.need_rows(width);
}

void indexer_logits(pyb::handle q_obj, pyb::handle w_obj, pyb::handle page_table_obj,
                    pyb::handle seq_lens_obj, pyb::handle pool_obj, pyb::handle logits_obj,
                    const std::string& layout, float w_scale, std::optional<uintptr_t> stream) {
  const KvDtype dtype = parse_layout(layout, "layout");
  ArrayArg q(q_obj, "q"), w(w_obj, "w"), page_table(page_table_obj, "page_table");
  ArrayArg seq_lens(seq_lens_obj, "seq_lens"), pool(pool_obj, "pool"), logits(logits_obj, "logits");
  if (!std::isfinite(w_scale)) {
    throw pyb::value_error(fmt::format("w_scale must be finite; got {}", w_scale));
  }
  IndexerLogitsParams p;
  p.w_scale = w_scale;
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
  m.def("indexer_logits", &indexer_logits, "q"_a, "w"_a, "page_table"_a, "seq_lens"_a, "pool"_a,
        "logits"_a, "layout"_a, "w_scale"_a, "stream"_a);
  m.def("topk", &topk, "logits"_a, "seq_lens"_a, "k"_a, "out_positions"_a, "out_slots"_a,
        "page_table"_a, "stream"_a);
  m.def("sparse_mla", &sparse_mla, "q"_a, "indices"_a, "pool"_a, "out"_a, "scale"_a, "lse"_a,
        "layout"_a, "stream"_a);
}

}  // namespace dsa::py
