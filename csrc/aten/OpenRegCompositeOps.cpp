// Operators whose CPU kernel is only a composition of other operators,
// registered on openreg as that same composition.
//
// The fallback would run such a kernel as one opaque CPU call, whose result
// the CPU allocates and openreg then copies into device memory. Registered
// here, the composition dispatches on openreg instead: its parts are
// structured operators, which PyTorch turns into out= calls on outputs
// already in device memory, and those are queued with nothing to copy.
// The arithmetic is the CPU's (same parts), so results stay bit-identical.
#include <ATen/ops/clamp_min.h>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)

namespace openreg {

// [doc:composite-register]
// As the CPU's relu (ATen's Activation.cpp): clamp_min(self, 0).
at::Tensor OpenRegNativeFunctions::relu(const at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool,
              "Boolean inputs not supported for relu");
  return at::clamp_min(self, 0);
}

at::Tensor& OpenRegNativeFunctions::relu_(at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool,
              "Boolean inputs not supported for relu");
  return at::clamp_min_(self, 0);
}

// [/doc:composite-register]

}  // namespace openreg
