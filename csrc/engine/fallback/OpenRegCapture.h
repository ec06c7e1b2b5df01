// What a queued fallback kernel captures of its arguments, and how it runs.
//
// A queued kernel runs later on the stream's worker, so it captures its
// arguments by value: non-owning references to device memory (a block freed
// on the host goes back to the caching allocator at once and is reused on
// the same stream only after this kernel, as on CUDA; use on another stream
// needs Tensor.record_stream) and snapshots of CPU tensors (the host may
// change them before the kernel runs). One device tensor passed twice is
// captured once, and tensors that share a device storage get kernel views
// that share one CPU storage, so the kernel sees the aliasing the caller
// made.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "aten/fallback/OpenRegOpTraits.h"
#include "engine/OpenRegKernelView.h"

namespace openreg {

// The captured arguments of one call. A device tensor passed directly (not
// in a list) is a DeviceTensorRef in `tensors`, its argument a placeholder
// in `args`; tensors inside lists are borrowed aliases in `args` (every
// device tensor of a call with a list argument is, so that one tensor
// passed twice still gives one view).
struct CapturedArgs {
  std::vector<c10::IValue> args;  // one per argument
  c10::SmallVector<DeviceTensorRef, 4> tensors;
  c10::SmallVector<std::pair<uint32_t, uint32_t>, 4> refs;  // (arg, tensor)

  // Empties it, keeping its capacity for the next call.
  void clear();
};

// Captures the call on top of `stack` (its last `traits.writes.size()`
// entries) into `out` (cleared first).
void capture_arguments(const torch::jit::Stack& stack, const OpTraits& traits,
                       CapturedArgs& out);

// The body of a queued fallback kernel: the CPU kernel over kernel views of
// the captured arguments. Returns the kernel's results. Written device
// tensors already have their final shape (the host resized them at the
// call); a kernel that would resize one fails.
torch::jit::Stack run_cpu_kernel(const c10::OperatorHandle& op,
                                 const OpTraits& traits,
                                 const CapturedArgs& captured,
                                 KernelViews& views);

// The same call through traits.out_variant, writing the results into
// `results` (device tensors allocated at the call with the plan's metadata,
// in the order of the operator's returns).
void run_cpu_kernel_into(const OpTraits& traits, const CapturedArgs& captured,
                         c10::ArrayRef<DeviceTensorRef> results,
                         KernelViews& views);

}  // namespace openreg
