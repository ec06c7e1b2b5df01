// Bindings that parts of the build outside python/ add to torch_openreg._C
// (the engine's: torch.compile's kernel launcher), so that Module.cpp never
// includes them: each registers its function from a static initializer, and
// the module calls them all when it loads.
#pragma once

#include <pybind11/pybind11.h>

namespace openreg {

using BindingsInit = void (*)(pybind11::module_& m);

// Returns true, for use as a static initializer.
bool add_bindings(BindingsInit init);

// Calls every added function on `m` (Module.cpp).
void init_added_bindings(pybind11::module_& m);

}  // namespace openreg
