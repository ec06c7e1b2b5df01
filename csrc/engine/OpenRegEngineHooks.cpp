// SIMULATOR ONLY. What the simulator's engine adds to the integration
// (core/OpenRegEngine.h), set when the extension loads: this file is the
// whole list. A port deletes csrc/engine/ and gets, for each hook, the
// behaviour of a device whose memory the host cannot map.
#include <c10/util/FunctionRef.h>
#include <openreg.h>
#include <pybind11/pybind11.h>

#include "core/OpenRegEngine.h"
#include "core/OpenRegNamedKernels.h"
#include "core/OpenRegStream.h"
#include "engine/OpenRegKernelView.h"
#include "engine/OpenRegViewCopy.h"
#include "engine/fallback/OpenRegDescribedCall.h"
#include "engine/fallback/OpenRegFallback.h"
#include "engine/memory/OpenRegKernelScratch.h"
#include "python/OpenRegAddedBindings.h"

namespace openreg {

namespace {

bool register_unboxed(torch::Library& library, const char* name,
                      const c10::OperatorHandle& op) {
  return unboxed_entries_enabled() && register_unboxed_entry(library, name, op);
}

// Host kernels on a driver of named kernels: the device memory their kernel
// views touch is staged through host memory, and what changed is copied
// back ("staged-kernels" in engine/OpenRegKernelView.h).
void run_staged(c10::function_ref<void()> kernel) {
  StagedKernelScope staged;
  kernel();
  staged.write_back_changed();
}

// The kernel library's workspace (engine/kernels/OpenRegWorkspace.h), freed in
// stream order on the device; a lost device has none left to free.
// And the host's workspace, for the kernels it runs from closures
// (engine/memory/OpenRegKernelScratch.h).
void empty_cache(c10::DeviceIndex device) {
  (void)orLaunchFunction(getCurrentStream(device).native(),
                         named_kernel(NamedKernel::kReleaseWorkspace), nullptr,
                         0, nullptr);
  release_kernel_scratch();
}

// torch.openreg.load_library(path): the operator library loaded into every
// device too, so that a device of its own process runs its operators; the
// host workspace's size, for tests.
void init_python(pybind11::module_& m) {
  m.def("_load_library", &load_operator_library, pybind11::arg("path"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("_kernel_scratch_cached_bytes", &kernel_scratch_cached_bytes,
        "Host bytes the device kernels' workspace cache holds for reuse "
        "(torch.openreg.empty_cache() frees them).");
}

// [doc:engine-hooks]
struct Install {
  Install() {
    Engine& e = engine();
    e.present = true;
    e.fallback = &fallback;
    e.route_ops = &route_layout_ops_to_fallback;
    e.register_unboxed = &register_unboxed;
    e.copy = &view_copy;
    e.run_staged = &run_staged;
    e.kernel_base = &kernel_base;
    e.empty_cache = &empty_cache;
    e.enter_host_kernel = [] { return begin_kernel_scratch(); };
    e.leave_host_kernel = [](bool previous) { end_kernel_scratch(previous); };
  }
} const install;
[[maybe_unused]] const bool python = add_bindings(&init_python);
// [/doc:engine-hooks]

}  // namespace

}  // namespace openreg
