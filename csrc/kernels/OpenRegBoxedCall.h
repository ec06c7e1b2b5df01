// Runs a serialized boxed call (kernels/OpenRegCallFormat.h) on the device:
// PyTorch's CPU kernel over CPU tensors that alias device memory, as the
// device itself sees it.
//
// This is device-side code: it uses ATen's CPU kernels and the dispatcher,
// never the openreg runtime or the PyTorch layer's host state, so the same
// code runs on the thread driver's stream worker (inside the extension) and
// in a device process (libopenreg_kernels.so,
// kernels/OpenRegKernelLibrary.cpp).
#pragma once

#include <cstddef>
#include <string>

namespace openreg {

// Where the kernel reads and writes the device memory at a device address
// (nullptr: not device memory).
struct Translate {
  void* (*fn)(void* state, const void* device_address);
  void* state;
};

// Where the kernel's warnings go when the call forwards them
// (call::kForwardWarnings): fn gets each one's text.
struct WarningSink {
  void (*fn)(void* state, const char* message) = nullptr;
  void* state = nullptr;
};

// Runs the call in `bytes`. Throws (c10::Error, std::runtime_error) what the
// CPU kernel throws, and on a malformed call. The kernel's warnings go to
// `warnings` if the call forwards them and `warnings.fn` is set, else to the
// calling thread's warning handler.
void run_boxed_call(const void* bytes, size_t size, Translate translate,
                    WarningSink warnings = {});

// The operator the call in `bytes` names, as "aten::add.out" ("" if the
// bytes are too short to say): how a failure on the device names its op.
std::string boxed_call_name(const void* bytes, size_t size);

}  // namespace openreg
