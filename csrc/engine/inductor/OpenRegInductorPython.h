// Python bindings of the torch.compile launcher (torch_openreg._C).
#pragma once

#include <pybind11/pybind11.h>

namespace openreg::inductor {

// Adds _CompiledKernel, _empty_strided and _current_raw_stream to `m`.
void init_python_bindings(pybind11::module_& m);

}  // namespace openreg::inductor
