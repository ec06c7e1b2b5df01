#include "inductor/OpenRegCompiledKernel.h"

#include <ATen/record_function.h>
#include <openreg.h>

#include <utility>

#include "aten/OpenRegLaunch.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"

namespace openreg::inductor {

namespace {

// [doc:compiled-kernel-params]
// Runs on the stream's worker: the one place where a compiled kernel's
// device pointers become kernel-view pointers.
void run_compiled_kernel(KernelEntry entry, const KernelArgs& args) {
  c10::SmallVector<void*, 16> kernel_ptrs(args.size(), nullptr);
  c10::SmallVector<void*, 16> params(args.size(), nullptr);
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg& arg = args[i];
    switch (arg.kind) {
      case KernelArg::Kind::DevicePointer:
        // Empty tensors have no memory (nullptr) and stay so.
        if (arg.device_ptr != nullptr) {
          OPENREG_CHECK(orGetKernelPointer(&kernel_ptrs[i], arg.device_ptr));
        }
        params[i] = &kernel_ptrs[i];
        break;
      case KernelArg::Kind::HostScalar:
        kernel_ptrs[i] = const_cast<unsigned char*>(arg.scalar);
        params[i] = &kernel_ptrs[i];
        break;
      case KernelArg::Kind::Int:
        params[i] = const_cast<int64_t*>(&arg.i);
        break;
      case KernelArg::Kind::Float:
        params[i] = const_cast<float*>(&arg.f);
        break;
    }
  }
  entry(params.data());
}
// [/doc:compiled-kernel-params]

}  // namespace

// [doc:compiled-kernel-launch]
void launch_compiled_kernel(c10::DeviceIndex device, const std::string& name,
                            KernelEntry entry, KernelArgs args) {
  TORCH_INTERNAL_ASSERT(entry != nullptr, "compiled kernel ", name,
                        " has no entry point");
  // The launch as an operator of its own in the profiler (compiled kernels
  // are called from the generated wrapper, not through the dispatcher).
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  TORCH_CHECK_NOT_IMPLEMENTED(
      host_kernels_supported(), "openreg: Inductor's compiled kernel ", name,
      " cannot run yet with a driver that runs named kernels only "
      "(OPENREG_DRIVER=process; docs/process-driver.md, step 5); use "
      "OPENREG_DRIVER=thread, the default");
  launch_async(device, name, [entry, args = std::move(args)] {
    run_compiled_kernel(entry, args);
  });
}
// [/doc:compiled-kernel-launch]

}  // namespace openreg::inductor
