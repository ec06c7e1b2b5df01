// Launching the kernels Inductor compiles for openreg (torch.compile).
//
// Inductor's C++ code generator writes each fused kernel as a host function
// over raw pointers and sizes. On real hardware a compiled kernel is device
// code the driver starts on a stream; here it is code in a shared library
// that must still behave like device code: it runs on the device (a stream
// worker of this process, or the device's own process), in stream order
// with eager kernels, copies and events, and reaches device memory only
// through the kernel view (a device tensor's data_ptr() is a PROT_NONE
// address the host must never dereference).
//
// The generated library exports one entry point with a uniform signature
// (torch_openreg/compile/inductor.py writes it):
//
//   extern "C" void openreg_launch(void* const* params);
//
// params[i] points at the value of the kernel's argument i, the convention
// of cuLaunchKernel's kernelParams. The host never calls it: a launch is the
// kernel library's `openreg_compiled_kernel` with bytes that name the
// library, the symbol and the arguments
// (engine/kernels/OpenRegCompiledKernelFormat.h), the one launch path of both
// drivers.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>

#include <string>

#include "engine/kernels/OpenRegCompiledKernelFormat.h"

namespace openreg::inductor {

// The fixed part of every launch of one kernel: the header, the kernel's
// name, the library's path and the symbol. Checks their lengths.
std::string compiled_kernel_prefix(const std::string& name,
                                   const std::string& path,
                                   const std::string& symbol);

// Queues the kernel whose prefix is `prefix` with `args` on the current
// stream of `device` and returns (with OPENREG_LAUNCH_BLOCKING=1 it runs at
// once and waits). Device addresses are translated to kernel pointers when
// the kernel runs, on the device, and nowhere else. They are not owners: as
// for eager kernels, a buffer the host frees after the launch returns to
// the caching allocator at once and is reused only in stream order. `name`
// names the kernel in errors, injected faults and the profiler.
void launch_compiled_kernel(c10::DeviceIndex device, const std::string& name,
                            const std::string& prefix,
                            c10::ArrayRef<compiled::CompiledKernelArg> args);

}  // namespace openreg::inductor
