// The synchronous path of the CPU fallback on a device of its own memory
// (issue 29): the first run of a signature, or an operator whose results
// depend on the data, runs on the device, and the host learns what it did
// from the device's answer (engine/kernels/OpenRegCallFormat.h, "described
// calls"): the results' metadata, the warnings, the error and its class.
//
// Used with either driver, so the first run takes the same launch path on
// both: with OPENREG_DRIVER=process the CPU kernel of such a call runs in
// the device's process, so a crash in it loses the device and not the
// program, and the host computes nothing; the thread driver's worker runs
// the same kernel of the kernel library in the user's process. What the
// call format cannot carry runs on the worker from a closure instead
// (run_sync in aten/OpenRegLaunch.h), or staged with the process driver.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "aten/fallback/OpenRegOpTraits.h"
#include "engine/fallback/OpenRegLaunchPlan.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

// Whether synchronous calls are described on such a driver:
// OPENREG_DESCRIBED_CALLS=0 stages them through host memory instead (the
// earlier path, kept to compare; "staged-kernels" in OpenRegKernelView.h).
bool described_calls_enabled();

// Whether the device answered that it has no such operator (one registered
// in this process only, such as a CPU kernel written in Python, which the
// device's process cannot run): its calls then run staged on the host, and
// are never queued.
bool device_lacks_operator(const c10::OperatorHandle& op);

// Loads the operator library at `path` (a shared object that registers
// operators and their CPU kernels with TORCH_LIBRARY, already loaded in this
// process by torch.ops.load_library) into every device, so that a device of
// its own process runs their calls instead of the host staging them
// (torch.openreg.load_library). Kept until the process ends, as
// torch.ops.load_library keeps it. Raises with the device's loader message
// when a device cannot load it.
void load_operator_library(const std::string& path);

// Runs the call on top of `stack` (the operator's arguments, `draws` the
// random draws of its generator arguments) on the device and waits for its
// answer; then replaces the arguments with the results, as a boxed kernel
// does, and fills `run` for learn_launch. `check_out_variant`: also check
// the operator's out= variant on the device. Raises what the CPU kernel
// raised, with its class, and what it warned. Returns false, having run and
// launched nothing, when the call cannot be described (what the call format
// cannot carry): the caller stages it. It may also return false after the
// device ran an operator that writes nothing and returned what the answer
// cannot carry (a sparse result): running it again is harmless.
bool run_described(const c10::OperatorHandle& op, const OpTraits& traits,
                   torch::jit::Stack* stack, c10::Device device,
                   c10::ArrayRef<std::pair<size_t, RandomDraw>> draws,
                   bool check_out_variant, int64_t elements, SyncRun* run);

}  // namespace openreg
