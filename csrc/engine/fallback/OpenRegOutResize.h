// Room on the device for the empty out= arguments of a synchronous
// fallback call, checked before the call runs.
//
// A call with out= arguments resizes them in its meta step. The fallback
// runs the CPU kernel on the device, over aliases of the arguments; an out=
// argument it grows lives in the device's own memory during the kernel and
// takes device memory only after it: `torch.arange(0, 2**27,
// device="openreg")` (whose factory writes into an empty out= tensor) on a
// 256 MiB device computed its 1 GiB on the host before it raised. Replayed
// on Meta tensors, the call says how large each empty out= argument grows:
// that much device memory is allocated and given back to the cache before
// the run, so torch.OutOfMemoryError comes first, as a CUDA operator
// allocates its outputs before its kernel runs. Nothing is changed: a call
// whose replay raises is left alone, and what a failed run resized comes
// back in the described call's answer (OpenRegDescribedCall.cpp,
// "failed-call-resized"), as the CPU kernel left it.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>

#include <vector>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// The bytes each empty out= argument grows to (none if the replay raises).
// `args`: the call's arguments. Raises only the user's interrupt.
std::vector<size_t> empty_out_bytes(const OpTraits& traits,
                                    c10::ArrayRef<c10::IValue> args);

// Allocates that much on `device` and gives it back at once: raises
// torch.OutOfMemoryError when the device cannot hold it. For the runs that
// do not reserve their results (a described call reserves them, and the
// device makes the grown arguments in that memory: ReservedResults.h).
void check_room_for_empty_outs(const OpTraits& traits,
                               c10::ArrayRef<c10::IValue> args,
                               c10::Device device);

}  // namespace openreg
