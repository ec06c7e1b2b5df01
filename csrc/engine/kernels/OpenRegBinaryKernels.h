// The device kernel of the direct binary path
// (engine/ops/OpenRegDirectBinary.h): add, sub, mul and true division of two
// dense float or double operands of one shape, or of one such operand and a
// number, on one thread. The thread driver's worker and a device process run it
// from the kernel library's `openreg_binary` with the byte parameters below.
//
// Device-side code: ATen's CPU headers only, never the runtime or the
// PyTorch layer's host state.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace openreg::kernels {

enum class BinaryOp : int32_t { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3 };

// out[i] = a[i] op b[i] (b_is_number: a[i] op number), over n elements of
// `dtype` (Float or Double). One IEEE operation per element, rounded once:
// the CPU kernels' values, bit for bit (ATen's add and sub with alpha 1
// compute b * 1 + a, which is exact before the one rounding).
void binary(BinaryOp op, const void* a, const void* b, void* out, int64_t n,
            c10::ScalarType dtype, bool b_is_number, double number);

struct BinaryParams {  // openreg_binary
  uint64_t a, b, out;  // device addresses (b: 0 with a number)
  int64_t n;
  double number;  // the number, already in `dtype` (exact in a double)
  int32_t op;     // BinaryOp
  int32_t dtype;  // c10::ScalarType: Float or Double
  int32_t b_is_number;
  int32_t reserved;
};

}  // namespace openreg::kernels
