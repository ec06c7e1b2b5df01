// What a queued fallback kernel captures of its arguments, and how it runs.
//
// A queued kernel runs later on the stream's worker, so it captures its
// arguments by value: non-owning handles over device memory (a block freed
// on the host goes back to the caching allocator at once and is reused on
// the same stream only after this kernel, as on CUDA; use on another stream
// needs Tensor.record_stream) and snapshots of CPU tensors (the host may
// change them before the kernel runs). One device tensor passed twice is
// captured once, so the kernel sees the same aliasing as the caller.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <vector>

#include "aten/OpenRegKernelView.h"
#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// The captured arguments of one call (the last `traits.writes.size()`
// entries of `stack`).
std::vector<c10::IValue> capture_arguments(const torch::jit::Stack& stack,
                                           const OpTraits& traits);

// The body of a queued fallback kernel: the CPU kernel over kernel views of
// the captured arguments. Returns the kernel's results. Written device
// tensors already have their final shape (the host resized them at the
// call); a kernel that would resize one fails.
torch::jit::Stack run_cpu_kernel(const c10::OperatorHandle& op,
                                 const OpTraits& traits,
                                 const std::vector<c10::IValue>& captured,
                                 KernelViews& views);

// The same call through traits.out_variant, writing the results into
// `results` (device tensors allocated at the call with the plan's metadata,
// in the order of the operator's returns).
void run_cpu_kernel_into(const OpTraits& traits,
                         const std::vector<c10::IValue>& captured,
                         c10::ArrayRef<at::Tensor> results, KernelViews& views);

}  // namespace openreg
