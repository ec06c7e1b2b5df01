// The queued path of the global fallback (OpenRegFallback.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/util/SmallVector.h>

#include <memory>

#include "aten/fallback/OpenRegOpTraits.h"
#include "engine/fallback/OpenRegLaunchPlan.h"

namespace openreg {

// Whether queued calls go to the device as serialized boxed calls
// (engine/kernels/OpenRegCallFormat.h), the form a device process runs;
// otherwise, and for a call the format cannot carry, as captured host objects.
// OPENREG_SERIALIZED_CALLS=0 turns it off (default: on).
bool serialized_calls();

// Runs a call of `op` whose signature has a launch plan: checks its scalars,
// replays the warnings the plan recorded, gives out= arguments their final
// shape, allocates the new results from the device allocator, captures the
// arguments (random ops reserve their draw) and queues the CPU kernel on
// the current stream of `device`. Leaves the arguments on `stack` and puts
// the results in `results`, a None where a result is one of the arguments
// (in-place and out= calls: `plan->outputs[r].arg`), which the caller
// returns.
void run_queued(const c10::OperatorHandle& op, const OpTraits& traits,
                const std::shared_ptr<const LaunchPlan>& plan,
                const torch::jit::Stack& stack, c10::Device device,
                c10::SmallVectorImpl<c10::IValue>* results);

}  // namespace openreg
