// Device memory for a call's new results, reserved before anything computes
// them (issue 29): the fallback's synchronous paths with a driver whose
// device has memory of its own (a described call, a staged call) allocate
// their results' blocks from the sizes the operator's Meta kernel gives, as
// a CUDA operator allocates its outputs before it launches its kernel.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Allocator.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// A block of device memory reserved for a call's new result.
struct ReservedBlock {
  uint64_t bytes;
  c10::DataPtr block;
};

// Device memory for the new results of a call of `op` with `args`, from the
// sizes its Meta kernel gives, allocated on the current stream before
// anything computes them: a result the device cannot hold raises
// torch.OutOfMemoryError here. Empty when the operator has no Meta kernel,
// its results' sizes depend on the data, or it returns no new tensor.
std::vector<ReservedBlock> reserve_results(const c10::OperatorHandle& op,
                                           const OpTraits& traits,
                                           c10::ArrayRef<c10::IValue> args);

// The reserved block of exactly `bytes`, taken out of `reserved`; an empty
// DataPtr if there is none.
c10::DataPtr take_reserved_block(std::vector<ReservedBlock>& reserved,
                                 uint64_t bytes);

}  // namespace openreg
