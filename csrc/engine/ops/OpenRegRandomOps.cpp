// Random operators with an openreg kernel: they draw from the device's
// generator (torch.Generator("openreg:N")), not the CPU's global one, so
// torch.openreg.manual_seed governs them.
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>

#include <cstdint>
#include <tuple>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)
#include "aten/OpenRegLaunch.h"
#include "core/OpenRegNamedKernels.h"
#include "engine/OpenRegKernelView.h"
#include "engine/kernels/OpenRegDropout.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

namespace {

// The dtypes and layouts the fused kernels take: floating tensors whose
// elements fill their memory exactly once (any dense permutation), so the
// kernel walks memory linearly and every tensor of the call has the same
// strides.
bool fusable(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) &&
         t.is_non_overlapping_and_dense();
}

// [doc:fused-dropout-launch]
// One kernel writes the mask and the result: the kernel library's named
// kernel openreg_dropout (engine/kernels/OpenRegDropout.cpp), with either
// driver. The draw is reserved here, in program order, so the bits do not
// depend on when or where the kernel runs.
std::tuple<at::Tensor, at::Tensor> fused_dropout(const at::Tensor& input,
                                                 double keep) {
  const double scale = keep == 0. ? 0. : 1. / keep;
  // keep = 1 keeps all: 2^24 is above every 24-bit value.
  const auto threshold =
      static_cast<uint32_t>(keep * static_cast<double>(1u << 24));
  at::Tensor out = at::empty_like(input);
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  const c10::DeviceIndex device = input.device().index();
  const RandomDraw draw = reserve_draw(std::nullopt, device);
  const int64_t n = input.numel();
  kernels::DropoutParams p{};
  p.in = device_address(input);
  p.out = device_address(out);
  p.mask = device_address(mask);
  p.n = n;
  p.seed = draw.seed;
  p.offset = draw.offset;
  p.scale = scale;
  p.threshold = threshold;
  p.dtype = static_cast<int32_t>(input.scalar_type());
  p.threads = kernel_thread_cap(n);
  launch_function(device, "aten::native_dropout",
                  named_kernel(NamedKernel::kDropout), &p, sizeof(p), n);
  return {out, mask};
}
// [/doc:fused-dropout-launch]

}  // namespace

std::tuple<at::Tensor, at::Tensor> OpenRegNativeFunctions::native_dropout(
    const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) {
    return {input, at::empty_like(input)};
  }
  if (!train.value_or(true)) {
    return {input.clone(),
            at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1. - p;
  if (fusable(input) && keep >= 0. && keep <= 1.) {
    return fused_dropout(input, keep);
  }
  // Other layouts and dtypes: the CPU's composition, with the mask drawn
  // from the device generator.
  const double scale = keep == 0. ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep, default_generator(input.device().index()));
  return {input.mul(mask).mul_(scale), mask};
}

// The CPU's `grad * mask * scale`, in one pass when the layouts allow.
at::Tensor OpenRegNativeFunctions::native_dropout_backward(
    const at::Tensor& grad, const at::Tensor& mask, double scale) {
  TORCH_CHECK(mask.scalar_type() == at::kBool,
              "Mask should be Bool Scalar Type", mask.scalar_type());
  if (!grad.defined() || !fusable(grad) || mask.device() != grad.device() ||
      !mask.is_non_overlapping_and_dense() || grad.sizes() != mask.sizes() ||
      grad.strides() != mask.strides() || grad.numel() == 0) {
    return at::mul(at::mul(grad, mask), scale);
  }
  at::Tensor out = at::empty_like(grad);
  const int64_t n = grad.numel();
  const c10::DeviceIndex device = grad.device().index();
  kernels::DropoutBackwardParams p{};
  p.grad = device_address(grad);
  p.mask = device_address(mask);
  p.out = device_address(out);
  p.n = n;
  p.scale = scale;
  p.dtype = static_cast<int32_t>(grad.scalar_type());
  p.threads = kernel_thread_cap(n);
  launch_function(device, "aten::native_dropout_backward",
                  named_kernel(NamedKernel::kDropoutBackward), &p, sizeof(p),
                  n);
  return out;
}

}  // namespace openreg
