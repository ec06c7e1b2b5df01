// Operators PyTorch routes to a backend-specific entry point instead of a
// CPU-style kernel, so the generic fallback cannot serve them:
//  - convolution: for PrivateUse1, at::convolution calls
//    convolution_overrideable and convolution_backward_overrideable;
//  - fused RNN cells: nn.LSTM / nn.GRU use _thnn_fused_lstm_cell and
//    _thnn_fused_gru_cell on accelerators; these have no CPU kernel.
#include <ATen/TensorOperators.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tanh.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)
#include "aten/OpenRegLaunch.h"
#include "engine/OpenRegKernelView.h"
#include "engine/fallback/OpenRegCallEncoder.h"

namespace openreg {

namespace {

void check_same_device(const at::Tensor& a, const at::Tensor& b,
                       const char* what) {
  TORCH_CHECK(a.device() == b.device(),
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ",
              a.device(), " and ", b.device(), "! (when checking ", what, ")");
}

// The memory format of the CPU convolution's results (output, input and
// weight gradients): channels-last when the input or the weight is, as the
// CPU (and cuDNN) choose, so models converted to channels_last keep it.
at::MemoryFormat conv_memory_format(const at::Tensor& input,
                                    const at::Tensor& weight) {
  auto is = [&](at::MemoryFormat f) {
    return input.suggest_memory_format() == f ||
           weight.suggest_memory_format() == f;
  };
  if (input.dim() == 4 && is(at::MemoryFormat::ChannelsLast)) {
    return at::MemoryFormat::ChannelsLast;
  }
  if (input.dim() == 5 && is(at::MemoryFormat::ChannelsLast3d)) {
    return at::MemoryFormat::ChannelsLast3d;
  }
  return at::MemoryFormat::Contiguous;
}

}  // namespace

at::Tensor OpenRegNativeFunctions::convolution_overrideable(
    const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups) {
  check_same_device(input, weight, "convolution weight");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    check_same_device(input, *bias, "convolution bias");
  }
  const c10::Device device = input.device();
  const c10::DeviceGuard guard(device);
  // The output shape is known on the host, so the convolution is queued. If
  // the shapes are inconsistent, run it now so the CPU's error is raised
  // at the call.
  const bool channels_ok =
      input.dim() == weight.dim() && input.dim() >= 3 &&
      (transposed ? input.size(1) == weight.size(0)
                  : input.size(1) == weight.size(1) * groups);
  std::vector<int64_t> out_size;
  if (channels_ok) {
    out_size = transposed
                   ? at::native::conv_input_size(input.sizes(), weight.sizes(),
                                                 padding, output_padding,
                                                 stride, dilation, groups)
                   : at::native::conv_output_size(input.sizes(), weight.sizes(),
                                                  padding, stride, dilation);
  }
  // With OPENREG_LAUNCH_BLOCKING=1 too: the launch then waits for it.
  const bool known =
      channels_ok && std::all_of(out_size.begin(), out_size.end(),
                                 [](int64_t d) { return d > 0; });
  if (known) {
    at::Tensor out = at::empty(
        out_size,
        input.options().memory_format(conv_memory_format(input, weight)));
    std::vector<int64_t> s(stride.begin(), stride.end());
    std::vector<int64_t> p(padding.begin(), padding.end());
    std::vector<int64_t> d(dilation.begin(), dilation.end());
    std::vector<int64_t> op(output_padding.begin(), output_padding.end());
    // The CPU's convolution, from bytes, with either driver. It writes a
    // temporary and copies it into `out`: no CPU convolution writes into a
    // tensor it is given (convolution.out, _convolution.out and
    // mkldnn_convolution.out compute into a temporary and copy too), and
    // _slow_conv2d_forward.output, the only one that writes in place, is the
    // slow im2col path.
    static const c10::OperatorHandle conv_op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
    if (launch_boxed_call(
            device.index(), "aten::convolution_overrideable", conv_op,
            {input, weight, has_bias ? c10::IValue(*bias) : c10::IValue(), s, p,
             d, transposed, op, groups},
            {out}, -1)) {
      return out;
    }
    // A call the format cannot carry runs now, below.
  }
  at::Tensor out;
  run_sync(device.index(), [&] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    KernelViews views;
    std::optional<at::Tensor> b;
    if (has_bias) {
      b = views.view(*bias);
    }
    out =
        at::convolution(views.view(input), views.view(weight), b, stride,
                        padding, dilation, transposed, output_padding, groups);
  });
  return copy_to_device(out, device);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
OpenRegNativeFunctions::convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  if (!grad_output.defined()) {
    // No gradient flows back, as autograd's formula for the CPU's
    // convolution answers.
    return {};
  }
  check_same_device(input, weight, "convolution weight");
  check_same_device(input, grad_output, "convolution grad_output");
  const c10::Device device = input.device();
  const c10::DeviceGuard guard(device);
  std::vector<int64_t> bias_sizes;
  if (output_mask[2]) {
    bias_sizes.push_back(transposed ? weight.size(1) * groups : weight.size(0));
  }
  // Gradient shapes are those of input, weight and bias: queued.
  const at::MemoryFormat format = conv_memory_format(input, weight);
  at::Tensor gi =
      output_mask[0]
          ? at::empty(input.sizes(), input.options().memory_format(format))
          : at::Tensor();
  at::Tensor gw =
      output_mask[1]
          ? at::empty(weight.sizes(), weight.options().memory_format(format))
          : at::Tensor();
  at::Tensor gb =
      output_mask[2] ? at::empty(bias_sizes, weight.options()) : at::Tensor();
  std::vector<int64_t> s(stride.begin(), stride.end());
  std::vector<int64_t> p(padding.begin(), padding.end());
  std::vector<int64_t> d(dilation.begin(), dilation.end());
  std::vector<int64_t> op(output_padding.begin(), output_padding.end());
  static const c10::OperatorHandle backward_op =
      c10::Dispatcher::singleton().findSchemaOrThrow(
          "aten::convolution_backward", "");
  const std::array<at::Tensor, 3> grads{gi, gw, gb};
  if (launch_boxed_call(
          device.index(), "aten::convolution_backward_overrideable",
          backward_op,
          {grad_output, input, weight,
           output_mask[2] ? c10::IValue(bias_sizes) : c10::IValue(), s, p, d,
           transposed, op, groups,
           c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})},
          grads, -1)) {
    return {gi, gw, gb};
  }
  // A call the format cannot carry runs now.
  run_sync(device.index(), [&] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    KernelViews views;
    auto [rgi, rgw, rgb] = at::convolution_backward(
        views.view(grad_output), views.view(input), views.view(weight),
        output_mask[2] ? std::optional<c10::IntArrayRef>(bias_sizes)
                       : std::nullopt,
        s, p, d, transposed, op, groups, output_mask);
    for (auto [out, r] :
         {std::pair{&gi, &rgi}, std::pair{&gw, &rgw}, std::pair{&gb, &rgb}}) {
      if (out->defined()) {
        views.view(*out).copy_(*r);
      }
    }
  });
  return {gi, gw, gb};
}

namespace {

at::Tensor add_bias(at::Tensor gates, const std::optional<at::Tensor>& bias) {
  if (bias.has_value() && bias->defined()) {
    return gates + *bias;
  }
  return gates;
}

}  // namespace

// [doc:rnn-cells]
// The LSTM cell written with ordinary operators; listed under `autograd` in
// csrc/openreg_native_functions.yaml, so it is registered at the autograd
// key and autograd differentiates the operators (no fused backward needed).
std::tuple<at::Tensor, at::Tensor, at::Tensor>
OpenRegNativeFunctions::_thnn_fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates,
    const at::Tensor& cx, const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates =
      add_bias(add_bias(input_gates + hidden_gates, input_bias), hidden_bias);
  auto chunks = gates.chunk(4, 1);
  at::Tensor i = at::sigmoid(chunks[0]);
  at::Tensor f = at::sigmoid(chunks[1]);
  at::Tensor g = at::tanh(chunks[2]);
  at::Tensor o = at::sigmoid(chunks[3]);
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * at::tanh(cy);
  at::Tensor workspace = at::cat({i, f, g, o}, 1);
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor> OpenRegNativeFunctions::_thnn_fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates,
    const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  auto ig = add_bias(input_gates, input_bias).chunk(3, 1);
  auto hg = add_bias(hidden_gates, hidden_bias).chunk(3, 1);
  at::Tensor r = at::sigmoid(ig[0] + hg[0]);
  at::Tensor z = at::sigmoid(ig[1] + hg[1]);
  at::Tensor n = at::tanh(ig[2] + r * hg[2]);
  at::Tensor hy = n + z * (hx - n);
  at::Tensor workspace = at::cat({r, z, ig[2], hg[2], n}, 1);
  return {hy, workspace};
}
// [/doc:rnn-cells]

}  // namespace openreg
