// What the fallbacks share (OpenRegFallback.cpp for strided tensors,
// OpenRegLayoutFallback.cpp for sparse and nested ones).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// The device an operator call runs on (its first openreg tensor, or an
// openreg Device argument); raises CUDA's error when its tensors are on
// several devices (CPU scalars aside, and CPU indices where the policy
// table allows them).
c10::Device find_device(const OpTraits& traits,
                        c10::ArrayRef<c10::IValue> args);

// Registers the layout fallback for every aten operator the CPU runs for a
// sparse or nested layout (OpenRegLayoutFallback.cpp); returns how many.
int route_layout_ops_to_fallback();

}  // namespace openreg
