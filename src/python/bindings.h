// The pieces of the `dsa._dsa` extension module, one registration function per file.
#pragma once

#include <pybind11/pybind11.h>

namespace dsa::py {

void bind_ops(pybind11::module_& m);      // ops.cpp
void bind_stores(pybind11::module_& m);   // stores.cpp
void bind_auditor(pybind11::module_& m);  // module.cpp

}  // namespace dsa::py
