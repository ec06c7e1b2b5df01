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

}  // namespace openreg
