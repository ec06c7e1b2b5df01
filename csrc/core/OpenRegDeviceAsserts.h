// Device-side assertions as CUDA reports them.
//
// On CUDA a bad value seen by a kernel (an index out of range in gather,
// index_select or embedding, a target out of range in nll_loss, a bad
// multinomial distribution: kernels/OpenRegDeviceAssertOps.h) is a
// device-side assert: nothing is raised at the call, the next
// synchronization raises "device-side assert triggered", and the CUDA
// context stays unusable until the process ends. The CPU raises an
// IndexError at the call instead, so code that catches it passes on the CPU
// and crashes on a GPU.
//
// OPENREG_DEVICE_ASSERTS chooses (docs/catches.md):
//  - "cuda" (the default; the point of running a CI on openreg is to see
//    what a GPU would do): such a failure makes the device unusable with an
//    AcceleratorError whose message says "device-side assert triggered",
//    names the operator and gives the CPU kernel's own words (the index, the
//    size). A queued call reports it at the next synchronization; a call the
//    host ran synchronously (a signature's first run) returns its results
//    (unspecified, as a GPU's) and the next call raises. With
//    OPENREG_LAUNCH_BLOCKING=1 it is raised at the call, as with
//    CUDA_LAUNCH_BLOCKING=1.
//  - "cpu": the CPU's behaviour: the CPU kernel's error (IndexError, ...)
//    at the call for a synchronous run, at the next synchronization for a
//    queued one, and the device stays usable. For test suites that expect
//    the CPU's exceptions from device tensors.
// Thread-safe.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace openreg {

// True with OPENREG_DEVICE_ASSERTS=cuda (the default); a bad value raises.
bool cuda_device_asserts();

// The message of a device-side assert of `op` on `device`, the CPU kernel
// having said `what`.
std::string device_assert_message(c10::DeviceIndex device,
                                  const std::string& op,
                                  const std::string& what);

// Makes `device` unusable with that message (faults::poison): every later
// call on it raises torch.AcceleratorError.
void trigger_device_assert(c10::DeviceIndex device, const std::string& op,
                           const std::string& what);

// For a deferred kernel failure "openreg kernel 'OP' failed on the device:
// WHAT" (the format of record_kernel_failure and the kernel library): when
// OP asserts on the device and cuda_device_asserts(), triggers the assert
// and returns its message; otherwise returns `message` unchanged.
std::string device_assert_of_failure(c10::DeviceIndex device,
                                     const std::string& message);

}  // namespace openreg
