// Random operators with an openreg kernel: they draw from the device's
// generator (torch.Generator("openreg:N")), not the CPU's global one, so
// torch.openreg.manual_seed governs them.
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include "random/OpenRegGenerator.h"

namespace openreg {

namespace {

// Dropout draws its mask from the device's generator (the CPU kernel would
// use the CPU's global generator, so torch.openreg.manual_seed would not
// govern it). Same arithmetic as the CPU kernel.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input,
                                                  double p,
                                                  std::optional<bool> train) {
  if (input.numel() == 0) {
    return {input, at::empty_like(input)};
  }
  if (!train.value_or(true)) {
    return {input.clone(),
            at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1. - p;
  const double scale = keep == 0. ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep, default_generator(input.device().index()));
  return {input.mul(mask).mul_(scale), mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(native_dropout));
}

}  // namespace openreg
