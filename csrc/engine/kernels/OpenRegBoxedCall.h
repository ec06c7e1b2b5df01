// Runs a serialized boxed call (engine/kernels/OpenRegCallFormat.h) on the
// device: PyTorch's CPU kernel over CPU tensors that alias device memory, as
// the device itself sees it.
//
// This is device-side code: it uses ATen's CPU kernels and the dispatcher,
// never the openreg runtime or the PyTorch layer's host state, so the same
// code runs on the thread driver's stream worker (inside the extension) and
// in a device process (libopenreg_kernels.so,
// kernels/OpenRegKernelLibrary.cpp).
#pragma once

#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// Runs the described call in `bytes` (call::Mode::kDescribe) and writes its
// answer (call::AnswerHeader and what follows) to `answer`, `capacity`
// bytes. When `out_name` is not empty, also runs that out= variant on new
// outputs like the results and answers whether it wrote the same bytes in
// place (the host then queues later calls through it). Returns the memory
// of the answer's new storages, in order, which the caller keeps until the
// host says where they go (openreg_take_results). A failure of the CPU
// kernel is answered, not thrown; a malformed call throws.
std::vector<c10::Storage> describe_boxed_call(const void* bytes, size_t size,
                                              Translate translate,
                                              const std::string& out_name,
                                              const std::string& out_overload,
                                              uint8_t* answer, size_t capacity);

// The operator the call in `bytes` names, as "aten::add.out" ("" if the
// bytes are too short to say): how a failure on the device names its op.
std::string boxed_call_name(const void* bytes, size_t size);

}  // namespace openreg
