// SIMULATOR ONLY: the direct binary path. The four arithmetic operators a
// program calls most on small tensors (add and sub with alpha 1, mul, true
// division), on dense float or double operands of one shape or with a
// Python number, skip the generic fallback (its launch plan, the call's
// encoding, the CPU kernel's TensorIterator on the device) and launch
// openreg's own kernel (engine/kernels/OpenRegBinaryKernels.h), as a backend
// with native kernels does for its hot operators. Every other call of these
// operators takes the fallback, as before.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <string>

#include "engine/kernels/OpenRegBinaryKernels.h"

namespace openreg {

// The result of `a op b` (alpha: add's and sub's, else nullptr), queued on
// a's device's current stream; undefined when the call is not one the path
// takes. `name` names the kernel for the profiler and the fault injection
// (the fallback's name for the operator).
at::Tensor direct_binary(kernels::BinaryOp op, const std::string& name,
                         const at::Tensor& a, const at::Tensor& b,
                         const c10::Scalar* alpha);

// False with OPENREG_DIRECT_BINARY=0 (every call takes the fallback, for
// comparison).
bool direct_binary_enabled();

}  // namespace openreg
