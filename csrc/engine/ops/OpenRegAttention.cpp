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
//    views. Results are therefore the CPU's, bit for bit. When the inputs
//    pass the CPU kernel's checks (done on the host), the kernel is queued
//    on the stream. Results are laid out as the ops' meta functions
//    (torch/_meta_registrations.py) lay them out: torch.compile allocates
//    and checks them by those.
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/SDPBackend.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)
#include "aten/OpenRegLaunch.h"
#include "core/OpenRegFunctions.h"
#include "engine/OpenRegKernelView.h"
#include "engine/fallback/OpenRegCallEncoder.h"

namespace openreg {

int64_t OpenRegNativeFunctions::_fused_sdp_choice(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask, double dropout_p,
    bool is_causal, std::optional<double> scale, bool enable_gqa) {
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

namespace {

// True if the CPU flash kernel accepts these inputs (its own checks, done
// on the host): then the results' metadata is known and the kernel can be
// queued. Anything else runs synchronously, so the CPU's error is raised at
// the call.
bool flash_accepts(const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const std::optional<at::Tensor>& mask,
                   double dropout_p) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || dropout_p != 0.0) {
    return false;
  }
  const bool same_shape = q.size(0) == k.size(0) && k.size(0) == v.size(0) &&
                          q.size(1) == k.size(1) && k.size(1) == v.size(1) &&
                          k.size(2) == v.size(2) && q.size(3) == k.size(3) &&
                          k.size(3) == v.size(3);
  const bool same_dtype = q.scalar_type() == k.scalar_type() &&
                          k.scalar_type() == v.scalar_type() &&
                          at::isFloatingType(q.scalar_type());
  const bool mask_ok = !mask.has_value() || !mask->defined() ||
                       ((mask->dim() == 2 || mask->dim() == 4) &&
                        (mask->scalar_type() == at::kFloat ||
                         mask->scalar_type() == q.scalar_type()));
  return same_shape && same_dtype && mask_ok;
}

// The CPU's flash-attention kernels, as a device that runs named kernels
// only runs them (launch_boxed_call).
const c10::OperatorHandle& flash_op() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(
          "aten::_scaled_dot_product_flash_attention_for_cpu", "");
  return op;
}

const c10::OperatorHandle& flash_backward_op() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(
          "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "");
  return op;
}

// The output as meta__scaled_dot_product_fused_attention_overrideable
// allocates it (alloc_with_matching_layout): like the query, or with the
// query's dimension order when the value's head size differs.
at::Tensor like_query(const at::Tensor& query, at::IntArrayRef shape) {
  if (query.sizes() == shape) {
    return at::empty_like(query);
  }
  if (query.dim() != 4) {
    return at::empty(shape, query.options());
  }
  std::array<int64_t, 4> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return query.stride(a) > query.stride(b);
  });
  std::array<int64_t, 4> strides{};
  int64_t stride = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = stride;
    stride *= shape[*it];
  }
  return at::empty_strided(shape, strides, query.options());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt,
           c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
OpenRegNativeFunctions::_scaled_dot_product_fused_attention_overrideable(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias, double dropout_p,
    bool is_causal, bool /*return_debug_mask*/, std::optional<double> scale) {
  const c10::Device device = query.device();
  const c10::DeviceGuard guard(device);
  const bool has_mask = attn_bias.has_value() && attn_bias->defined();
  std::vector<int64_t> out_shape = query.sizes().vec();
  out_shape.back() = value.size(-1);
  at::Tensor out = like_query(query, out_shape);
  const int64_t batch = query.dim() == 4 ? query.size(0) : 1;
  at::Tensor logsumexp =
      at::empty({batch, query.size(-3), query.size(-2)},
                query.options().dtype(at::toOpMathType(query.scalar_type())));
  const bool queued = flash_accepts(query, key, value, attn_bias, dropout_p);
  const std::array<at::Tensor, 2> results{out, logsumexp};
  if (queued &&
      launch_boxed_call(
          device.index(),
          "aten::_scaled_dot_product_fused_attention_overrideable", flash_op(),
          {query, key, value, dropout_p, is_causal,
           has_mask ? c10::IValue(*attn_bias) : c10::IValue(),
           scale.has_value() ? c10::IValue(*scale) : c10::IValue()},
          results, -1)) {
    // The device runs the CPU's flash kernel from bytes, with either driver.
  } else {
    at::Tensor cpu_out;
    at::Tensor cpu_logsumexp;
    run_sync(device.index(), [&] {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      KernelViews views;
      std::optional<at::Tensor> mask;
      if (has_mask) {
        mask = views.view(*attn_bias);
      }
      std::tie(cpu_out, cpu_logsumexp) =
          at::_scaled_dot_product_flash_attention_for_cpu(
              views.view(query), views.view(key), views.view(value), dropout_p,
              is_causal, mask, scale);
    });
    out.copy_(cpu_out);
    logsumexp.copy_(cpu_logsumexp.reshape(logsumexp.sizes()));
  }
  return {out,
          logsumexp,
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(0),
          c10::SymInt(0),
          at::empty({}, query.options().dtype(at::kLong)),
          at::empty({}, query.options().dtype(at::kLong)),
          at::Tensor()};
}

namespace {

// The gradient of the additive mask (the CPU's flash kernel has none): the
// gradient of the attention scores, dS = P * (dP - rowsum(dO * O)) with
// P = exp(S - logsumexp) and dP = dO V^T, summed over the dimensions the mask
// was broadcast along. Written with operators, so it runs queued on the
// device like any other.
at::Tensor mask_gradient(const at::Tensor& grad_out, const at::Tensor& query,
                         const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& attn_bias, const at::Tensor& out,
                         const at::Tensor& logsumexp, bool is_causal,
                         std::optional<double> scale) {
  TORCH_CHECK(attn_bias.defined(),
              "the gradient of the attention mask was requested, but no mask "
              "was given");
  TORCH_CHECK(query.size(1) == key.size(1),
              "openreg computes the gradient of the attention mask only when "
              "query and key have the same number of heads (got ",
              query.size(1), " and ", key.size(1), ")");
  const at::NoGradGuard no_grad;
  const at::ScalarType math = at::toOpMathType(query.scalar_type());
  const double s = scale.has_value()
                       ? *scale
                       : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
  at::Tensor q = query.to(math);
  at::Tensor scores = at::matmul(q, key.to(math).transpose(-2, -1))
                          .mul_(s)
                          .add_(attn_bias.to(math));
  if (is_causal) {
    const int64_t l = query.size(-2);
    const int64_t sk = key.size(-2);
    at::Tensor keep = at::ones({l, sk}, q.options().dtype(at::kBool)).tril();
    scores.masked_fill_(keep.logical_not(),
                        -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = (scores - logsumexp.to(math).unsqueeze(-1)).exp_();
  at::Tensor go = grad_out.to(math);
  at::Tensor dp = at::matmul(go, value.to(math).transpose(-2, -1));
  at::Tensor rows = (go * out.to(math)).sum(-1, /*keepdim=*/true);
  at::Tensor ds = probs.mul_(dp.sub_(rows));
  return at::sum_to(ds, attn_bias.sizes()).to(attn_bias.scalar_type());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
OpenRegNativeFunctions::
    _scaled_dot_product_fused_attention_overrideable_backward(
        const at::Tensor& grad_out, const at::Tensor& query,
        const at::Tensor& key, const at::Tensor& value,
        const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask,
        const at::Tensor& out, const at::Tensor& logsumexp,
        const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/,
        int64_t /*max_q*/, int64_t /*max_k*/, double dropout_p, bool is_causal,
        const at::Tensor& /*philox_seed*/, const at::Tensor& /*philox_offset*/,
        std::optional<double> scale) {
  if (!grad_out.defined()) {
    // No gradient flows back (the CPU's flash backward answers the same).
    return {};
  }
  const c10::Device device = query.device();
  const c10::DeviceGuard guard(device);
  const bool has_mask = attn_bias.defined();
  if (flash_accepts(
          query, key, value,
          has_mask ? std::optional<at::Tensor>(attn_bias) : std::nullopt,
          dropout_p)) {
    // Gradients like their inputs, as the meta function allocates them.
    at::Tensor gq = at::empty_like(query);
    at::Tensor gk = at::empty_like(key);
    at::Tensor gv = at::empty_like(value);
    const char* name =
        "aten::_scaled_dot_product_fused_attention_overrideable_backward";
    const std::array<at::Tensor, 3> grads{gq, gk, gv};
    if (launch_boxed_call(
            device.index(), name, flash_backward_op(),
            {grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
             has_mask ? c10::IValue(attn_bias) : c10::IValue(),
             scale.has_value() ? c10::IValue(*scale) : c10::IValue()},
            grads, -1)) {
      return {gq, gk, gv,
              grad_input_mask[3]
                  ? mask_gradient(grad_out, query, key, value, attn_bias, out,
                                  logsumexp, is_causal, scale)
                  : at::Tensor()};
    }
  }
  at::Tensor gq, gk, gv;
  run_sync(device.index(), [&] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    KernelViews views;
    std::optional<at::Tensor> mask;
    if (has_mask) {
      mask = views.view(attn_bias);
    }
    std::tie(gq, gk, gv) =
        at::_scaled_dot_product_flash_attention_for_cpu_backward(
            views.view(grad_out), views.view(query), views.view(key),
            views.view(value), views.view(out), views.view(logsumexp),
            dropout_p, is_causal, mask, scale);
  });
  at::Tensor rq = at::empty_like(query);
  at::Tensor rk = at::empty_like(key);
  at::Tensor rv = at::empty_like(value);
  rq.copy_(gq);
  rk.copy_(gk);
  rv.copy_(gv);
  return {rq, rk, rv,
          grad_input_mask[3]
              ? mask_gradient(grad_out, query, key, value, attn_bias, out,
                              logsumexp, is_causal, scale)
              : at::Tensor()};
}

}  // namespace openreg

// [doc:sdpa-register]
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(
    _fused_sdp_choice_stub, &openreg::OpenRegNativeFunctions::_fused_sdp_choice)
}  // namespace at::native
// [/doc:sdpa-register]
