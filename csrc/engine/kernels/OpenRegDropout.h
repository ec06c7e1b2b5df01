// openreg's fused dropout kernels as device-side code: the same functions
// run on the thread driver's stream worker (engine/ops/OpenRegRandomOps.cpp,
// from a host closure) and in a device process (libopenreg_kernels.so's
// openreg_dropout and openreg_dropout_backward, from the byte parameters
// below), so both drivers draw the same numbers and compute the same bits.
//
// Device-side code: ATen's CPU headers only, never the runtime or the
// PyTorch layer's host state.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace openreg::kernels {

// Forward: out = in * mask * scale with element i (in memory order) kept
// when the top 24 bits of number i of the Philox stream of (seed, offset)
// are below `threshold` (keep * 2^24). n elements, dense, one dtype.
void dropout(const void* in, void* out, bool* mask, int64_t n,
             c10::ScalarType dtype, uint32_t threshold, double scale,
             uint64_t seed, uint64_t offset);

// Backward: out = grad * mask * scale, elementwise over n dense elements.
void dropout_backward(const void* grad, const bool* mask, void* out, int64_t n,
                      c10::ScalarType dtype, double scale);

// The byte parameters of the library's kernels: device addresses as uint64,
// plain fixed-width fields, no padding the compiler chooses.
struct DropoutParams {  // openreg_dropout
  uint64_t in, out, mask;
  int64_t n;
  uint64_t seed, offset;
  double scale;
  uint32_t threshold;
  int32_t dtype;    // c10::ScalarType
  int32_t threads;  // the most threads of its parallel region (0: any)
  int32_t pad = 0;
};

struct DropoutBackwardParams {  // openreg_dropout_backward
  uint64_t grad, mask, out;
  int64_t n;
  double scale;
  int32_t dtype;
  int32_t threads;
};

}  // namespace openreg::kernels
