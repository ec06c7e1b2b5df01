#include "engine/fallback/OpenRegCapture.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/SmallVector.h>

#include <utility>

#include "aten/fallback/OpenRegIValue.h"

namespace openreg {

void CapturedArgs::clear() {
  args.clear();
  tensors.clear();
  refs.clear();
}

void capture_arguments(const torch::jit::Stack& stack, const OpTraits& traits,
                       CapturedArgs& out) {
  out.clear();
  const size_t num_args = traits.writes.size();
  const size_t first = stack.size() - num_args;
  bool has_list = false;
  for (size_t i = 0; i < num_args; ++i) {
    has_list = has_list || stack[first + i].isList();
  }
  out.args.reserve(num_args);
  if (!has_list) {
    // Device tensors become references; one per TensorImpl.
    c10::SmallVector<const c10::TensorImpl*, 4> seen;
    for (size_t i = 0; i < num_args; ++i) {
      const c10::IValue& v = stack[first + i];
      if (!v.isTensor()) {
        out.args.push_back(v);
        continue;
      }
      const at::Tensor& t = v.toTensor();
      if (!is_openreg(t)) {
        // An undefined tensor, a Python number made for this call, or a
        // CPU tensor, snapshotted.
        const bool keep =
            !t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number();
        out.args.emplace_back(keep ? t : t.clone());
        continue;
      }
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      uint32_t k = 0;
      while (k < seen.size() && seen[k] != impl) {
        ++k;
      }
      if (k == seen.size()) {
        seen.push_back(impl);
        out.tensors.emplace_back(t);
      }
      out.args.emplace_back();
      out.refs.emplace_back(static_cast<uint32_t>(i), k);
    }
    return;
  }
  // With lists: borrowed aliases, one per TensorImpl.
  c10::SmallVector<std::pair<c10::TensorImpl*, at::Tensor>, 8> seen;
  for (size_t i = 0; i < num_args; ++i) {
    out.args.push_back(map_tensors(stack[first + i], [&](const at::Tensor& t) {
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
}

namespace {

// Written device arguments: what the host made of them, and their views.
struct Written {
  c10::IntArrayRef sizes;
  c10::IntArrayRef strides;
  bool conj;
  bool neg;
  at::Tensor view;
};

// The CPU kernel's stack: kernel views of the captured device tensors (room
// for `extra` more entries); `written` gets each written device tensor.
torch::jit::Stack kernel_arguments(const OpTraits& traits,
                                   const CapturedArgs& captured,
                                   KernelViews& views, size_t extra,
                                   c10::SmallVector<Written, 4>& written) {
  torch::jit::Stack stack;
  stack.reserve(captured.args.size() + extra);
  for (size_t i = 0; i < captured.args.size(); ++i) {
    const bool writes = traits.writes[i] && captured.args[i].isTensor();
    stack.push_back(map_tensors(captured.args[i], [&](const at::Tensor& t) {
      if (!is_openreg(t)) {
        return t;
      }
      at::Tensor view = views.view(t);
      if (writes) {
        written.push_back(
            {t.sizes(), t.strides(), t.is_conj(), t.is_neg(), view});
      }
      return view;
    }));
  }
  for (const auto& [i, k] : captured.refs) {
    const DeviceTensorRef& t = captured.tensors[k];
    at::Tensor view = views.view(t);
    if (traits.writes[i]) {
      written.push_back({t.sizes, t.strides, t.conj, t.neg, view});
    }
    stack[i] = std::move(view);
  }
  return stack;
}

void check_written(c10::ArrayRef<Written> written) {
  for (const Written& w : written) {
    TORCH_CHECK(w.sizes == w.view.sizes() && w.strides == w.view.strides(),
                "the CPU kernel resized an out= argument of shape ", w.sizes,
                " to ", w.view.sizes(),
                " on the device; the host should have resized it at the call");
    TORCH_INTERNAL_ASSERT(
        w.conj == w.view.is_conj() && w.neg == w.view.is_neg(),
        "the CPU kernel changed the conjugate/negative bit of its out= "
        "argument in a queued launch (such signatures run synchronously)");
  }
}

}  // namespace

torch::jit::Stack run_cpu_kernel(const c10::OperatorHandle& op,
                                 const OpTraits& traits,
                                 const CapturedArgs& captured,
                                 KernelViews& views) {
  c10::SmallVector<Written, 4> written;
  torch::jit::Stack stack =
      kernel_arguments(traits, captured, views, 0, written);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  check_written(written);
  return stack;
}

void run_cpu_kernel_into(const OpTraits& traits, const CapturedArgs& captured,
                         c10::ArrayRef<DeviceTensorRef> results,
                         KernelViews& views) {
  TORCH_INTERNAL_ASSERT(traits.out_variant.has_value());
  c10::SmallVector<Written, 4> written;
  torch::jit::Stack stack =
      kernel_arguments(traits, captured, views, results.size(), written);
  TORCH_INTERNAL_ASSERT(written.empty(),
                        "a functional operator writes none of its arguments");
  for (const DeviceTensorRef& r : results) {
    stack.emplace_back(views.view(r));
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  traits.out_variant->redispatchBoxed(
      c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
}

}  // namespace openreg
