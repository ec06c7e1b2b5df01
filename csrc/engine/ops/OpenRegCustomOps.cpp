// A custom operator with its own schema, as a vendor would add one:
//   openreg::scaled_abs(Tensor x, float scale) -> Tensor   (= scale * |x|)
// with a CPU kernel, an openreg kernel (the device kernel
// engine/kernels/OpenRegCustomOpKernels.h, queued on the stream), a Meta kernel
// (shapes only: serves torch.compile's fake tensors), and an autograd
// formula registered once for every backend.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sgn.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "aten/OpenRegLaunch.h"
#include "core/OpenRegNamedKernels.h"
#include "engine/OpenRegKernelView.h"
#include "engine/kernels/OpenRegCustomOpKernels.h"

namespace openreg {

namespace {

at::Tensor scaled_abs_cpu(const at::Tensor& x, double scale) {
  return at::abs(x).mul_(scale);
}

// [doc:custom-op-kernel]
// The device kernel runs over dense memory: a strided view is made
// contiguous first (a queued copy). Its output has the input's layout.
at::Tensor scaled_abs_openreg(const at::Tensor& x, double scale) {
  const at::Tensor in = x.is_non_overlapping_and_dense() ? x : x.contiguous();
  at::Tensor out = at::empty_like(in);
  const c10::DeviceIndex device = in.device().index();
  const int64_t n = in.numel();
  // The kernel library's kernel, by name, with either driver.
  kernels::ScaledAbsParams p{};
  p.in = device_address(in);
  p.out = device_address(out);
  p.n = n;
  p.scale = scale;
  p.dtype = static_cast<int32_t>(in.scalar_type());
  p.threads = kernel_thread_cap(n);
  launch_function(device, "openreg::scaled_abs",
                  named_kernel(NamedKernel::kScaledAbs), &p, sizeof(p), n);
  return out;
}
// [/doc:custom-op-kernel]

at::Tensor scaled_abs_meta(const at::Tensor& x, double /*scale*/) {
  return at::empty_like(x);
}

// [doc:custom-op-autograd]
// d/dx scale * |x| = scale * sgn(x)
class ScaledAbs : public torch::autograd::Function<ScaledAbs> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& x, double scale) {
    ctx->save_for_backward({x});
    ctx->saved_data["scale"] = scale;
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("openreg::scaled_abs", "")
                         .typed<at::Tensor(const at::Tensor&, double)>();
    return op.call(x, scale);
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const double scale = ctx->saved_data["scale"].toDouble();
    return {grads[0] * at::sgn(x) * scale, at::Tensor()};
  }
};

at::Tensor scaled_abs_autograd(const at::Tensor& x, double scale) {
  return ScaledAbs::apply(x, scale);
}
// [/doc:custom-op-autograd]

}  // namespace

// [doc:custom-op-register]
TORCH_LIBRARY(openreg, m) {
  m.def("scaled_abs(Tensor x, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(openreg, CPU, m) {
  m.impl("scaled_abs", TORCH_FN(scaled_abs_cpu));
}

TORCH_LIBRARY_IMPL(openreg, PrivateUse1, m) {
  m.impl("scaled_abs", TORCH_FN(scaled_abs_openreg));
}

TORCH_LIBRARY_IMPL(openreg, Meta, m) {
  m.impl("scaled_abs", TORCH_FN(scaled_abs_meta));
}

TORCH_LIBRARY_IMPL(openreg, Autograd, m) {
  m.impl("scaled_abs", TORCH_FN(scaled_abs_autograd));
}
// [/doc:custom-op-register]

}  // namespace openreg
