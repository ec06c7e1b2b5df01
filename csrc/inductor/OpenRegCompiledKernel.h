// Launching the kernels Inductor compiles for openreg (torch.compile).
//
// Inductor's C++ code generator writes each fused kernel as a host function
// over raw pointers and sizes. On real hardware a compiled kernel is device
// code the driver starts on a stream; here it is host code that must still
// behave like device code: it runs on the stream's worker, in stream order
// with eager kernels, copies and events, and reaches device memory only
// through the kernel view (a device tensor's data_ptr() is a PROT_NONE
// address the host must never dereference).
//
// The generated library exports one entry point per kernel with a uniform
// signature (torch_openreg/compile/inductor.py writes it):
//
//   extern "C" void openreg_launch(void* const* params);
//
// params[i] points at the value of the kernel's argument i, the convention
// of cuLaunchKernel's kernelParams, so one launcher serves every kernel
// whatever its argument list.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace openreg::inductor {

// The entry point of a compiled kernel (see above).
using KernelEntry = void (*)(void* const* params);

// One argument of a compiled kernel, as the host passes it.
struct KernelArg {
  enum class Kind : uint8_t {
    DevicePointer,  // a buffer: the device address (data_ptr()) of a tensor
    HostScalar,     // a one-element CPU tensor the kernel reads: its value,
                    // snapshotted at launch (as CUDA passes a CPU scalar)
    Int,            // a size or index (int64_t)
    Float,          // a float scalar (unbacked float symbols)
  };
  static constexpr size_t kMaxScalarBytes = 16;  // complex<double>

  Kind kind = Kind::Int;
  union {
    const void* device_ptr = nullptr;
    int64_t i;
    float f;
    alignas(16) unsigned char scalar[kMaxScalarBytes];
  };

  static KernelArg pointer(const void* p) {
    KernelArg a;
    a.kind = Kind::DevicePointer;
    a.device_ptr = p;
    return a;
  }
  static KernelArg host_scalar(const void* p, size_t nbytes) {
    KernelArg a;
    a.kind = Kind::HostScalar;
    std::memcpy(a.scalar, p, nbytes);
    return a;
  }
  static KernelArg integer(int64_t v) {
    KernelArg a;
    a.i = v;
    return a;
  }
  static KernelArg real(float v) {
    KernelArg a;
    a.kind = Kind::Float;
    a.f = v;
    return a;
  }
};

using KernelArgs = c10::SmallVector<KernelArg, 16>;

// Queues `entry(args)` on the current stream of `device` and returns (with
// OPENREG_LAUNCH_BLOCKING=1 it runs at once and waits, through
// launch_async). Device pointers are translated to kernel pointers when the
// kernel runs, here and nowhere else. The pointers are not owners: as for
// eager kernels, a buffer the host frees after the launch returns to the
// caching allocator at once and is reused only in stream order. `name`
// names the kernel in errors and in the profiler.
void launch_compiled_kernel(c10::DeviceIndex device, const std::string& name,
                            KernelEntry entry, KernelArgs args);

}  // namespace openreg::inductor
