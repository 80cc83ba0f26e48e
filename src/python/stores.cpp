// The guarded cache writers on the caller's arrays, two ways in:
//   store_index_k / store_latent_kv   every argument read and checked on every call;
//   IndexKWriter / LatentKVWriter     one layer's pool bound once: the pool, its layout, the error
//                                     counter and the stream are read and checked at construction,
//                                     and a call reads only the slot map, the values and n_real.
// Both fill the same params and call the same backend op (one writer per layout: the same
// judge_slot and the same token codec as the C++ runtime), so they write the same bytes.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>

#include "dsa/backend.h"
#include "python/array_arg.h"
#include "python/bindings.h"
#include "python/pools.h"

namespace dsa::py {
namespace pyb = pybind11;
using namespace pybind11::literals;

namespace {

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

// The slot map's rows; the slot map, n_real and the error counter as a batch.
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

// The index keys of a store: float32, or bf16 (a uint16 array read as bf16 bit patterns), at least
// one row of 128 per slot-map row, unit inner stride, on the pool's device.
void set_index_keys(StoreIndexKParams& p, const ArrayArg& k, const ArrayArg& pool) {
  k.need_dtype({Dtype::kF32, Dtype::kBf16, Dtype::kU16}, "(uint16 is read as bf16 bit patterns)");
  p.ld_k = need_value_rows(k, kIndexHeadDim, p.batch.rows, pool);
  if (k.dtype() == Dtype::kF32) {
    p.k = k.as<float>();
  } else {
    p.k_bf16 = k.as<Bf16>();
  }
}

void set_latent_values(StoreLatentKvParams& p, const ArrayArg& latent, const ArrayArg& k_rope,
                       const ArrayArg& pool) {
  p.ld_latent = need_f32_rows(latent, kKvLoraRank, p.batch.rows, pool);
  p.ld_rope = need_f32_rows(k_rope, kRopeDim, p.batch.rows, pool);
  p.latent = latent.as<float>();
  p.k_rope = k_rope.as<float>();
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
  set_index_keys(p, k, pool);
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
  set_latent_values(p, latent, k_rope, pool);
  backend_for(pool.place(), caller_stream(stream, pool.place()))->store_latent_kv(p);
}

// A one-element int32 array holding `value` beside `pool`, made by the pool's own library
// (torch.full on the pool's device, waited for; numpy.full); None for any other kind of array. Not
// under CUDA graph capture, where torch.full would only be recorded: the value must be there when
// made.
pyb::object int32_scalar_like(pyb::handle pool, int32_t value) {
  const std::string module = pyb::str(pyb::type::handle_of(pool).attr("__module__"));
  const std::string root = module.substr(0, module.find('.'));
  if (root == "torch") {
    const pyb::module_ torch = pyb::module_::import("torch");
    const bool cuda = pool.attr("is_cuda").cast<bool>();
    if (cuda && torch.attr("cuda").attr("is_current_stream_capturing")().cast<bool>()) {
      throw pyb::value_error(
          "make the writer outside CUDA graph capture: its device scalars (the error counter, and "
          "the count an int n_real runs against) are filled when it is made");
    }
    pyb::object scalar =
        torch.attr("full")(pyb::make_tuple(1), value, "dtype"_a = torch.attr("int32"),
                           "device"_a = pool.attr("device"));
    // Filled before any stream reads it: the writer may run on another stream than this one.
    if (cuda) {
      torch.attr("cuda").attr("current_stream")(pool.attr("device")).attr("synchronize")();
    }
    return scalar;
  }
  if (root == "numpy") {
    const pyb::module_ numpy = pyb::module_::import("numpy");
    return numpy.attr("full")(1, value, "dtype"_a = numpy.attr("int32"));
  }
  return pyb::none();
}

// A stream argument: None (torch's current stream, looked up per call) or an integer handle.
std::optional<uintptr_t> stream_arg(const pyb::object& stream) {
  if (stream.is_none()) return std::nullopt;
  return pyb::int_(stream).cast<uintptr_t>();
}

// What the two bound writers share: the pool bound once, the error counter, the stream, and the
// batch of a call. A Python int n_real is taken without a device scalar: under the contract the
// writer processes min(len(slots), n_real) rows against an n_real of 2^31 - 1 held on the device,
// which writes and counts exactly what n_real on the device would (rule 1 skips rows >= n_real
// silently, before rules 2-4 are asked); the incident's scatter ignores n_real either way.
class BoundWriter {
 public:
  pyb::object pool() const { return pool_obj_; }
  pyb::object errors() const { return errors_obj_; }
  std::string layout() const { return std::string(kv_dtype_name(view_.dtype)); }

 protected:
  BoundWriter(pyb::handle pool, PoolKind kind, const std::string& layout, bool ue8m0,
              pyb::handle errors, const pyb::object& stream)
      : pool_obj_(pyb::reinterpret_borrow<pyb::object>(pool)),
        pool_(pool, "pool"),
        view_(pool_view(pool_, kind, parse_layout(layout, "layout"), ue8m0)),
        errors_obj_(errors.is_none() ? int32_scalar_like(pool, 0)
                                     : pyb::reinterpret_borrow<pyb::object>(errors)),
        all_rows_obj_(int32_scalar_like(pool, INT32_MAX)),
        errors_(checked_scalar(errors_obj_, "errors")),
        stream_(stream_arg(stream)) {
    if (!all_rows_obj_.is_none()) all_rows_.emplace(all_rows_obj_, "n_real");
  }

  // The batch of a call: the slot map, n_real and the bound error counter; rows = len(slots).
  // n_real is a Python int (returned in host_n_real) or a one-element int32 array on the pool's
  // device (viewed into n_real_view).
  SlotBatch batch(const ArrayArg& slots, pyb::handle n_real, std::optional<ArrayArg>& n_real_view,
                  std::optional<int>& host_n_real) const {
    SlotBatch b;
    b.rows = need_vector(slots, Dtype::kI64, pool_);
    b.slots = slots.as<int64_t>();
    b.error_count = errors_.as<int32_t>();
    PyObject* o = n_real.ptr();
    if (!PyLong_Check(o)) {
      n_real_view.emplace(n_real, "n_real");
      need_scalar_i32(*n_real_view, pool_);
      b.n_real = n_real_view->as<int32_t>();
      return b;
    }
    if (PyBool_Check(o)) {
      throw pyb::type_error(
          "argument 'n_real' must be an int or a one-element int32 array, got bool");
    }
    const long long value = PyLong_AsLongLong(o);
    if (value == -1 && PyErr_Occurred()) PyErr_Clear();
    if (value < 0 || value >= int64_t(1) << 31) {
      throw pyb::value_error(fmt::format("argument 'n_real' must be in [0, 2^31), got {}",
                                         std::string(pyb::str(n_real))));
    }
    if (!all_rows_) {
      throw pyb::type_error(
          "argument 'n_real' as a Python int needs 'pool' to be a torch tensor or a numpy array; "
          "pass a one-element int32 array on the pool's device instead");
    }
    host_n_real = int(value);
    b.n_real = all_rows_->as<int32_t>();
    return b;
  }

  // After the values are checked against len(slots): the rows a host n_real leaves to process.
  static int rows_to_process(const SlotBatch& b, std::optional<int> host_n_real, StoreGuard guard) {
    if (!host_n_real || guard == StoreGuard::kIncidentScatter) return b.rows;
    return std::min(b.rows, *host_n_real);
  }

  BackendHandle backend() const {
    return backend_for(pool_.place(), caller_stream(stream_, pool_.place()));
  }

  const pyb::object pool_obj_;  // keeps the caller's pool alive while the writer lives
  const ArrayArg pool_;
  const PoolView view_;

 private:
  ArrayArg checked_scalar(const pyb::object& obj, const char* name) const {
    if (obj.is_none()) {
      throw pyb::type_error(fmt::format(
          "argument '{}' as None needs 'pool' to be a torch tensor or a numpy array; pass a "
          "one-element int32 array on the pool's device instead",
          name));
    }
    ArrayArg a(obj, name);
    need_scalar_i32(a, pool_);
    return a;
  }

  const pyb::object errors_obj_, all_rows_obj_;
  const ArrayArg errors_;
  std::optional<ArrayArg> all_rows_;  // [1] int32 = 2^31 - 1 on the pool's device
  const std::optional<uintptr_t> stream_;
};

class IndexKWriter final : public BoundWriter {
 public:
  IndexKWriter(pyb::handle pool, const std::string& layout, bool ue8m0, pyb::handle errors,
               const std::string& guard, const pyb::object& stream)
      : BoundWriter(pool, PoolKind::kIndexK, layout, ue8m0, errors, stream),
        guard_(parse_guard(guard, view_.dtype)) {}

  pyb::object operator()(pyb::handle slots_obj, pyb::handle k_obj, pyb::handle n_real) const {
    const ArrayArg slots(slots_obj, "slots"), k(k_obj, "k");
    std::optional<ArrayArg> n_real_view;
    std::optional<int> host_n_real;
    StoreIndexKParams p;
    p.pool = view_;
    p.batch = batch(slots, n_real, n_real_view, host_n_real);
    set_index_keys(p, k, pool_);
    p.guard = guard_;
    p.batch.rows = rows_to_process(p.batch, host_n_real, guard_);
    backend()->store_index_k(p);
    return errors();
  }

 private:
  const StoreGuard guard_;
};

class LatentKVWriter final : public BoundWriter {
 public:
  LatentKVWriter(pyb::handle pool, const std::string& layout, bool ue8m0, pyb::handle errors,
                 const pyb::object& stream)
      : BoundWriter(pool, PoolKind::kLatent, layout, ue8m0, errors, stream) {}

  pyb::object operator()(pyb::handle slots_obj, pyb::handle latent_obj, pyb::handle k_rope_obj,
                         pyb::handle n_real) const {
    const ArrayArg slots(slots_obj, "slots"), latent(latent_obj, "latent");
    const ArrayArg k_rope(k_rope_obj, "k_rope");
    std::optional<ArrayArg> n_real_view;
    std::optional<int> host_n_real;
    StoreLatentKvParams p;
    p.pool = view_;
    p.batch = batch(slots, n_real, n_real_view, host_n_real);
    set_latent_values(p, latent, k_rope, pool_);
    p.batch.rows = rows_to_process(p.batch, host_n_real, StoreGuard::kEnforced);
    backend()->store_latent_kv(p);
    return errors();
  }
};

}  // namespace

void bind_stores(pyb::module_& m) {
  m.def("store_index_k", &store_index_k, "pool"_a, "slots"_a, "k"_a, "n_real"_a, "errors"_a,
        "layout"_a, "ue8m0"_a, "guard"_a, "stream"_a);
  m.def("store_latent_kv", &store_latent_kv, "pool"_a, "slots"_a, "latent"_a, "k_rope"_a,
        "n_real"_a, "errors"_a, "layout"_a, "ue8m0"_a, "stream"_a);
  pyb::class_<IndexKWriter>(m, "IndexKWriter")
      .def(pyb::init<pyb::handle, const std::string&, bool, pyb::handle, const std::string&,
                     const pyb::object&>(),
           "pool"_a, pyb::kw_only(), "layout"_a = "bf16", "ue8m0"_a = false,
           "errors"_a = pyb::none(), "guard"_a = "contract", "stream"_a = pyb::none())
      .def("__call__", &IndexKWriter::operator(), "slots"_a, "k"_a, "n_real"_a,
           "Stores k[r] into slot slots[r] for the rows the store rules allow; returns errors.")
      .def_property_readonly("pool", &IndexKWriter::pool)
      .def_property_readonly("errors", &IndexKWriter::errors)
      .def_property_readonly("layout", &IndexKWriter::layout);
  pyb::class_<LatentKVWriter>(m, "LatentKVWriter")
      .def(pyb::init<pyb::handle, const std::string&, bool, pyb::handle, const pyb::object&>(),
           "pool"_a, pyb::kw_only(), "layout"_a = "bf16", "ue8m0"_a = false,
           "errors"_a = pyb::none(), "stream"_a = pyb::none())
      .def("__call__", &LatentKVWriter::operator(), "slots"_a, "latent"_a, "k_rope"_a, "n_real"_a,
           "Stores (latent[r], k_rope[r]) into slot slots[r] for the rows the store rules allow; "
           "returns errors.")
      .def_property_readonly("pool", &LatentKVWriter::pool)
      .def_property_readonly("errors", &LatentKVWriter::errors)
      .def_property_readonly("layout", &LatentKVWriter::layout);
}

}  // namespace dsa::py
