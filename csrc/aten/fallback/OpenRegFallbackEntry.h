// The fallback's entry (OpenRegFallbackEntry.cpp): what both fallbacks share.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// The device an operator call runs on (its first openreg tensor, or an
// openreg Device argument); raises CUDA's error when its tensors are on
// several devices (CPU scalars aside, and CPU indices where the policy
// table allows them).
c10::Device find_device(const OpTraits& traits,
                        c10::ArrayRef<c10::IValue> args);

// True when the call's tensors live on more than one device (CPU scalars
// aside): a _foreach_ list over several devices runs one operator per
// tensor.
bool spans_devices(c10::ArrayRef<c10::IValue> args);

// Registers, when the Python module loads (after every static
// registration), the fallback for the operators whose generic kernel would
// otherwise serve openreg (OpenRegFallbackEntry.cpp), then the engine's
// routes or, without an engine, the refusal of other layouts. Returns how
// many operators it routed.
int route_ops();

// Registers the refusal of sparse and nested tensors (no engine).
void refuse_other_layouts();

}  // namespace openreg
