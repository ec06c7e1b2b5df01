#include "engine/kernels/OpenRegCustomOpKernels.h"

#include <ATen/ops/abs.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mul.h>

namespace openreg::kernels {

void scaled_abs(const void* in, void* out, int64_t n, c10::ScalarType dtype,
                double scale) {
  const auto options = at::TensorOptions().dtype(dtype);
  const at::Tensor src = at::from_blob(const_cast<void*>(in), {n}, options);
  at::Tensor dst = at::from_blob(out, {n}, options);
  at::abs_out(dst, src);
  dst.mul_(scale);
}

}  // namespace openreg::kernels
