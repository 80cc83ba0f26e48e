// The `dsa._dsa` extension: the raw bindings. python/dsa/__init__.py wraps them with defaults
// (n_real as an int, a fresh error counter) and the documentation; a stream of None is torch's
// current stream (array_arg.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dsa/backend.h"
#include "dsa/error.h"
#include "python/auditor.h"
#include "python/bindings.h"

#ifndef DSA_VERSION
#define DSA_VERSION "0.0.0"
#endif

namespace dsa::py {
namespace pyb = pybind11;
using namespace pybind11::literals;

void bind_auditor(pyb::module_& m) {
  pyb::class_<PoolAuditor>(m, "PoolAuditor")
      .def(pyb::init<const pyb::list&, bool>(), "pools"_a, "ue8m0"_a)
      .def("record", &PoolAuditor::record, "slots"_a, "owners"_a, "values"_a, "step"_a, "stream"_a)
      .def("release", &PoolAuditor::release, "slots"_a)
      .def("release_owner", &PoolAuditor::release_owner, "owner"_a)
      .def("verify_all", &PoolAuditor::verify_all, "step"_a, "stream"_a)
      .def("verify_slots", &PoolAuditor::verify_slots, "slots"_a, "step"_a, "stream"_a)
      .def("verify_sample", &PoolAuditor::verify_sample, "count"_a, "seed"_a, "step"_a, "stream"_a)
      .def("verify_async", &PoolAuditor::verify_async, "count"_a, "seed"_a, "step"_a, "stream"_a)
      .def("poll", &PoolAuditor::poll, "wait"_a, "stream"_a)
      .def("flush", pyb::overload_cast<std::optional<uintptr_t>>(&PoolAuditor::flush), "stream"_a)
      .def_property_readonly("mirror_dirty", &PoolAuditor::mirror_dirty)
      .def_property_readonly("async_counts", &PoolAuditor::async_counts)
      .def("sample_positions", &PoolAuditor::sample_positions, "count"_a, "seed"_a, "step"_a,
           "device"_a, "stream"_a)
      .def_property_readonly("watched", &PoolAuditor::watched)
      .def_property_readonly("capacity", &PoolAuditor::capacity)
      .def_property_readonly("audited", &PoolAuditor::audited)
      .def("describe_pools", &PoolAuditor::describe_pools)
      .def("last_verify_us", &PoolAuditor::last_verify_us);
}

}  // namespace dsa::py

PYBIND11_MODULE(_dsa, m) {
  m.doc() = "dsa.cpp's guarded cache writers, kernels and slot auditor (raw bindings)";
  m.attr("__version__") = DSA_VERSION;
  m.def("cuda_built", [] {
#if defined(DSA_HAVE_CUDA)
    return true;
#else
    return false;
#endif
  });
  m.def("cuda_available", &dsa::cuda_available);
  pybind11::register_exception_translator([](std::exception_ptr e) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const dsa::Error& err) {
      if (err.code() == dsa::ErrorCode::kInvalidArgument ||
          err.code() == dsa::ErrorCode::kOutOfRange) {
        PyErr_SetString(PyExc_ValueError, err.what());
      } else if (err.code() == dsa::ErrorCode::kResourceExhausted) {
        PyErr_SetString(PyExc_MemoryError, err.what());
      } else {
        PyErr_SetString(PyExc_RuntimeError, err.what());
      }
    }
  });
  dsa::py::bind_ops(m);
  dsa::py::bind_stores(m);
  dsa::py::bind_auditor(m);
}
