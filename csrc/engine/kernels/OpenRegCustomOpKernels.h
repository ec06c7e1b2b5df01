// The device kernel of the example custom operator openreg::scaled_abs
// (engine/ops/OpenRegCustomOps.cpp), as device-side code: the thread driver's
// worker calls it from a closure, a device process from the kernel library's
// `openreg_scaled_abs` with the byte parameters below. This is where a
// vendor's own operator kernels go: in the device's kernel library, launched
// by name, never as host code.
//
// Device-side code: ATen's CPU headers only, never the runtime or the
// PyTorch layer's host state.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace openreg::kernels {

// out = scale * |in| over n dense elements of one dtype (the CPU kernel's
// arithmetic, so the same values).
void scaled_abs(const void* in, void* out, int64_t n, c10::ScalarType dtype,
                double scale);

struct ScaledAbsParams {  // openreg_scaled_abs
  uint64_t in, out;       // device addresses
  int64_t n;
  double scale;
  int32_t dtype;    // c10::ScalarType
  int32_t threads;  // the most threads of its parallel regions (0: any)
};

}  // namespace openreg::kernels
