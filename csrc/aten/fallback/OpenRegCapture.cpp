#include "aten/fallback/OpenRegCapture.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/SmallVector.h>

#include <utility>

#include "aten/fallback/OpenRegIValue.h"

namespace openreg {

std::vector<c10::IValue> capture_arguments(const torch::jit::Stack& stack,
                                           const OpTraits& traits) {
  const size_t num_args = traits.writes.size();
  const size_t first = stack.size() - num_args;
  c10::SmallVector<std::pair<c10::TensorImpl*, at::Tensor>, 8> seen;
  std::vector<c10::IValue> captured;
  captured.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    captured.push_back(map_tensors(stack[first + i], [&](const at::Tensor& t) {
      if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) {
        return t;  // a Python number, made for this call
      }
      c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      for (const auto& [key, c] : seen) {
        if (key == impl) {
          return c;
        }
      }
      at::Tensor c = is_openreg(t) ? borrowed_alias(t) : t.clone();
      seen.emplace_back(impl, c);
      return c;
    }));
  }
  return captured;
}

namespace {

using Written = c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4>;

// The CPU kernel's stack: kernel views of the captured device tensors (room
// for `extra` more entries); `written` gets each written device tensor with
// its view.
torch::jit::Stack kernel_arguments(const OpTraits& traits,
                                   const std::vector<c10::IValue>& captured,
                                   KernelViews& views, size_t extra,
                                   Written& written) {
  torch::jit::Stack stack;
  stack.reserve(captured.size() + extra);
  for (size_t i = 0; i < captured.size(); ++i) {
    const bool writes = traits.writes[i] && captured[i].isTensor();
    stack.push_back(map_tensors(captured[i], [&](const at::Tensor& t) {
      if (!is_openreg(t)) {
        return t;
      }
      at::Tensor view = views.view(t);
      if (writes) {
        written.emplace_back(t, view);
      }
      return view;
    }));
  }
  return stack;
}

}  // namespace

torch::jit::Stack run_cpu_kernel(const c10::OperatorHandle& op,
                                 const OpTraits& traits,
                                 const std::vector<c10::IValue>& captured,
                                 KernelViews& views) {
  Written written;
  torch::jit::Stack stack =
      kernel_arguments(traits, captured, views, 0, written);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  for (const auto& [dev, view] : written) {
    TORCH_CHECK(dev.sizes() == view.sizes() && dev.strides() == view.strides(),
                "the CPU kernel resized an out= argument of shape ",
                dev.sizes(), " to ", view.sizes(),
                " on the device; the host should have resized it at the call");
    TORCH_INTERNAL_ASSERT(
        dev.is_conj() == view.is_conj() && dev.is_neg() == view.is_neg(),
        "the CPU kernel changed the conjugate/negative bit of its out= "
        "argument in a queued launch (such signatures run synchronously)");
  }
  return stack;
}

void run_cpu_kernel_into(const OpTraits& traits,
                         const std::vector<c10::IValue>& captured,
                         c10::ArrayRef<at::Tensor> results,
                         KernelViews& views) {
  TORCH_INTERNAL_ASSERT(traits.out_variant.has_value());
  Written written;
  torch::jit::Stack stack =
      kernel_arguments(traits, captured, views, results.size(), written);
  TORCH_INTERNAL_ASSERT(written.empty(),
                        "a functional operator writes none of its arguments");
  for (const at::Tensor& r : results) {
    stack.emplace_back(views.view(r));
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  traits.out_variant->redispatchBoxed(
      c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
}

}  // namespace openreg
