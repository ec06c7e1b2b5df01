// Python bindings of the allocator's history (memory/OpenRegMemoryHistory.h):
// what torch.openreg.memory._record_memory_history and _snapshot call.
#pragma once

#include <pybind11/pybind11.h>

namespace openreg {

// Adds _record_memory_history and _memory_snapshot_full to `m`.
void init_memory_history_bindings(pybind11::module_& m);

}  // namespace openreg
