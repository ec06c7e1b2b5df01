// Convolution without an engine (compiled only when csrc/engine/ is absent,
// csrc/CMakeLists.txt): PyTorch reaches an accelerator's convolution through
// convolution_overrideable and its backward only, which have no CPU kernel,
// so the fallback never sees them. These run the CPU's aten::convolution and
// aten::convolution_backward through the copying fallback: arguments to the
// host, results back. A port replaces them by its device's kernels.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)
#include "aten/fallback/OpenRegCopyingFallback.h"

namespace openreg {

namespace {

std::vector<int64_t> vec(c10::IntArrayRef a) { return a.vec(); }

}  // namespace

at::Tensor OpenRegNativeFunctions::convolution_overrideable(
    const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  const c10::DeviceGuard guard(input.device());
  torch::jit::Stack stack{
      input,        weight,        bias,       vec(stride),
      vec(padding), vec(dilation), transposed, vec(output_padding),
      groups};
  copying_fallback(op, &stack);
  return stack.back().toTensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
OpenRegNativeFunctions::convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  if (!grad_output.defined()) {
    return {};  // no gradient flows back, as for the CPU's convolution
  }
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(
          "aten::convolution_backward", "");
  const c10::DeviceGuard guard(input.device());
  // The bias's size, for its gradient: the output channels.
  std::optional<std::vector<int64_t>> bias_sizes;
  if (output_mask[2]) {
    bias_sizes = std::vector<int64_t>{transposed ? weight.size(1) * groups
                                                 : weight.size(0)};
  }
  torch::jit::Stack stack{
      grad_output,
      input,
      weight,
      bias_sizes,
      vec(stride),
      vec(padding),
      vec(dilation),
      transposed,
      vec(output_padding),
      groups,
      c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})};
  copying_fallback(op, &stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

}  // namespace openreg
