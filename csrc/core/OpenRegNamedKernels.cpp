#include "core/OpenRegNamedKernels.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <mutex>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"

namespace openreg {

namespace {

// In the order of NamedKernel.
constexpr std::array<const char*, 14> kSymbols = {
    "openreg_boxed_call",        "openreg_fault_crash",
    "openreg_fault_fail",        "openreg_fault_delay",
    "openreg_profiler_stamp",    "openreg_dropout",
    "openreg_dropout_backward",  "openreg_compiled_kernel",
    "openreg_scaled_abs",        "openreg_fault_warn",
    "openreg_release_workspace", "openreg_describe_call",
    "openreg_take_results",      "openreg_binary"};

struct Library {
  orModule_t module = nullptr;
  std::array<orFunction_t, kSymbols.size()> functions{};
};

const Library& library() {
  // Loaded once and kept for the life of the process: queued kernels may
  // still use it at exit.
  static const Library lib = [] {
    lazy_init();
    Library l;
    const std::string path = kernel_library_path();
    const orError_t err = orModuleLoad(&l.module, path.c_str());
    TORCH_CHECK(err == orSuccess, "openreg: cannot load the kernel library '",
                path, "': ", orGetErrorString(err),
                " (set OPENREG_KERNELS_LIBRARY to its path)");
    for (size_t i = 0; i < kSymbols.size(); ++i) {
      // A kernel the library lacks (the engine's, in a build without it)
      // stays null: named_kernel() refuses it by name.
      const orError_t found =
          orModuleGetFunction(&l.functions[i], l.module, kSymbols[i]);
      if (found == orErrorSymbolNotFound) {
        l.functions[i] = nullptr;
      } else {
        OPENREG_CHECK(found);
      }
    }
    return l;
  }();
  return lib;
}

}  // namespace

std::string kernel_library_path() {
  if (const char* env = std::getenv("OPENREG_KERNELS_LIBRARY")) {
    return env;
  }
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&kernel_library_path), &info) != 0 &&
      info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) {
      return self.substr(0, slash + 1) + "libopenreg_kernels.so";
    }
  }
  return "libopenreg_kernels.so";
}

orFunction_t named_kernel(NamedKernel kernel) {
  const auto i = static_cast<size_t>(kernel);
  const orFunction_t f = library().functions[i];
  TORCH_CHECK(f != nullptr, "openreg: the kernel library '",
              kernel_library_path(), "' has no kernel ", kSymbols[i],
              " (a kernel of the simulator's engine, absent from this build)");
  return f;
}

}  // namespace openreg
