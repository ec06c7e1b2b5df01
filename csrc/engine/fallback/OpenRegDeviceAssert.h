// A synchronous run (a signature's first) whose CPU kernel raised, turned
// into a device-side assert as CUDA reports one (core/OpenRegDeviceAsserts.h).
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <string>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// `stack` holds the call's arguments (the last traits.writes.size()
// values). When the failure is what a CUDA kernel reports as a device-side
// assert (the operator asserts on the device, OPENREG_DEVICE_ASSERTS=cuda,
// and the call replays on Meta tensors without an error: its shapes and
// dtypes are right, only values the kernel read were not), makes the
// device unusable and, with OPENREG_LAUNCH_BLOCKING=1, raises the assert
// now; otherwise replaces the arguments by the call's results, made on the
// device with the Meta kernel's metadata (their values unspecified, as a
// GPU's), and returns true: the next call on the device raises. Returns
// false for any other failure: the caller raises the CPU kernel's error.
bool defer_device_assert(const OpTraits& traits, torch::jit::Stack* stack,
                         c10::Device device, const std::string& what);

}  // namespace openreg
