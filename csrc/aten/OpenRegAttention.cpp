// scaled_dot_product_attention on openreg, through PyTorch's overrideable path.
//
// Two integration points a vendor uses:
//  - a DispatchStub: PyTorch asks `_fused_sdp_choice_stub` which SDPA backend
//    a PrivateUse1 device wants; we register ours with
//    REGISTER_PRIVATEUSE1_DISPATCH and answer "overrideable" whenever the
//    CPU would pick its fused (flash) kernel for the same inputs, "math"
//    otherwise (dropout, a mask that needs a gradient, ...);
//  - the overrideable kernels
//  `_scaled_dot_product_fused_attention_overrideable`
//    and its backward, which run the CPU flash-attention kernels on the kernel
//    views. Results are therefore the CPU's, bit for bit.
#include <ATen/SDPBackend.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/OpenRegKernelView.h"

namespace openreg {

namespace {

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key,
                         const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask,
                         double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // Only metadata is inspected: meta tensors of the same shape suffice.
  auto meta = [](const at::Tensor& t) {
    return at::empty(t.sizes(), t.options().device(c10::kMeta));
  };
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) {
    if (attn_mask->requires_grad()) {
      return static_cast<int64_t>(at::SDPBackend::math);
    }
    mask = meta(*attn_mask);
  }
  const int64_t cpu_choice = at::native::_fused_sdp_choice_cpp(
      meta(query), meta(key), meta(value), mask, dropout_p, is_causal, scale,
      enable_gqa);
  return cpu_choice == static_cast<int64_t>(at::SDPBackend::flash_attention)
             ? static_cast<int64_t>(at::SDPBackend::overrideable)
             : static_cast<int64_t>(at::SDPBackend::math);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt,
           c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
fused_attention(const at::Tensor& query, const at::Tensor& key,
                const at::Tensor& value,
                const std::optional<at::Tensor>& attn_bias, double dropout_p,
                bool is_causal, bool /*return_debug_mask*/,
                std::optional<double> scale) {
  const c10::DeviceGuard guard(query.device());
  at::Tensor out;
  at::Tensor logsumexp;
  run_sync(query.device().index(), [&] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    KernelViews views;
    std::optional<at::Tensor> mask;
    if (attn_bias.has_value() && attn_bias->defined()) {
      mask = views.view(*attn_bias);
    }
    std::tie(out, logsumexp) = at::_scaled_dot_product_flash_attention_for_cpu(
        views.view(query), views.view(key), views.view(value), dropout_p,
        is_causal, mask, scale);
  });
  const c10::Device device = query.device();
  return {copy_to_device(out, device),
          copy_to_device(logsumexp, device),
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(0),
          c10::SymInt(0),
          at::empty({}, query.options().dtype(at::kLong)),
          at::empty({}, query.options().dtype(at::kLong)),
          at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias,
    std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& /*cum_seq_q*/,
    const at::Tensor& /*cum_seq_k*/, int64_t /*max_q*/, int64_t /*max_k*/,
    double dropout_p, bool is_causal, const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/, std::optional<double> scale) {
  TORCH_CHECK(!grad_input_mask[3],
              "openreg's fused attention does not differentiate the mask "
              "(such calls take the math backend)");
  const c10::DeviceGuard guard(query.device());
  at::Tensor gq, gk, gv;
  run_sync(query.device().index(), [&] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    KernelViews views;
    std::optional<at::Tensor> mask;
    if (attn_bias.defined()) {
      mask = views.view(attn_bias);
    }
    std::tie(gq, gk, gv) =
        at::_scaled_dot_product_flash_attention_for_cpu_backward(
            views.view(grad_out), views.view(query), views.view(key),
            views.view(value), views.view(out), views.view(logsumexp),
            dropout_p, is_causal, mask, scale);
  });
  const c10::Device device = query.device();
  return {copy_to_device(gq, device), copy_to_device(gk, device),
          copy_to_device(gv, device), at::Tensor()};
}

}  // namespace

}  // namespace openreg

// [doc:sdpa-register]
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub,
                              &openreg::fused_sdp_choice)
}  // namespace at::native

namespace openreg {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable",
         TORCH_FN(fused_attention));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         TORCH_FN(fused_attention_backward));
}
// [/doc:sdpa-register]

}  // namespace openreg
