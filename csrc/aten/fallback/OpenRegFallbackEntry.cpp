// The fallback's entry, which every backend needs: the registration of one
// boxed kernel for every operator without a kernel of its own, the device
// check every fallback makes first, and the choice of the fallback that
// runs: the engine's when this build has one (core/OpenRegEngine.h: the
// simulator's, PyTorch's CPU kernels on the device memory), otherwise, or
// with OPENREG_FALLBACK=copy, the copying fallback of a device the host
// cannot map (OpenRegCopyingFallback.h).
#include "aten/fallback/OpenRegFallbackEntry.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "aten/fallback/OpenRegCopyingFallback.h"
#include "aten/fallback/OpenRegIValue.h"
#include "aten/fallback/OpenRegOpTraits.h"
#include "core/OpenRegEngine.h"

namespace openreg {

c10::Device find_device(const OpTraits& traits,
                        c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> device;
  std::optional<c10::Device> other;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined()) {
        return;
      }
      if (is_openreg(t)) {
        if (!device) {
          device = t.device();
        } else {
          TORCH_CHECK(*device == t.device(),
                      "Expected all tensors to be on the same device, but "
                      "found at least two devices, ",
                      *device, " and ", t.device(),
                      "! (when checking arguments for ", traits.display_name,
                      ")");
        }
      } else if (t.device().is_cpu()) {
        if (t.dim() != 0 && !other) {
          other = t.device();  // CPU scalars (0-dim) are allowed, as on CUDA
        }
      } else if (!other) {
        other = t.device();
      }
    });
  }
  if (device && (traits.policy & kAcceptsCpuTensors) != 0 &&
      args.front().isTensor() && args.front().toTensor().defined()) {
    // Indices may stay on the CPU, the indexed tensor may not.
    const at::Tensor& self = args.front().toTensor();
    TORCH_CHECK(is_openreg(self),
                "indices should be either on cpu or on the same device "
                "as the indexed tensor (",
                self.device(), ")");
  }
  if (device) {
    TORCH_CHECK(!other || (other->is_cpu() &&
                           (traits.policy & kAcceptsCpuTensors) != 0),
                "Expected all tensors to be on the same device, but found at "
                "least two devices, ",
                *device, " and ", *other, "! (when checking arguments for ",
                traits.display_name, ")");
    return *device;
  }
  for (const c10::IValue& v : args) {
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return v.toDevice();
    }
  }
  TORCH_CHECK(false, "openreg fallback for ", traits.display_name,
              " found no openreg tensor or device among its arguments");
}

// True when the call's tensors live on more than one device (CPU scalars
// aside).
bool spans_devices(c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> seen;
  bool spans = false;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) {
        return;
      }
      if (!seen) {
        seen = t.device();
      } else if (*seen != t.device()) {
        spans = true;
      }
    });
  }
  return spans;
}

namespace {

void fallback_entry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (engine().fallback != nullptr && !copying_fallback_selected()) {
    engine().fallback(op, stack);
  } else {
    copying_fallback(op, stack);
  }
}

// Without the engine's layout fallback: sparse and nested tensors of the
// device are refused by name, instead of reaching the dispatcher's "Could
// not run ... with arguments from the 'SparsePrivateUse1' backend".
void refuse_layout(const c10::OperatorHandle& op,
                   torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "openreg runs strided tensors only: '", op.schema().name(),
      "' was called with a sparse or nested tensor, which needs kernels for "
      "the SparsePrivateUse1, SparseCsrPrivateUse1 or NestedTensorPrivateUse1 "
      "dispatch keys (the copying fallback copies strided storages only)");
}

}  // namespace

void refuse_other_layouts() {
  static torch::Library* libraries[3] = {};
  TORCH_INTERNAL_ASSERT(libraries[0] == nullptr, "registered twice");
  const c10::DispatchKey keys[] = {c10::DispatchKey::SparsePrivateUse1,
                                   c10::DispatchKey::SparseCsrPrivateUse1,
                                   c10::DispatchKey::NestedTensorPrivateUse1};
  for (size_t k = 0; k < 3; ++k) {
    libraries[k] = new torch::Library(torch::Library::IMPL, "_", keys[k],
                                      __FILE__, __LINE__);
    libraries[k]->fallback(
        torch::CppFunction::makeFromBoxedFunction<&refuse_layout>());
  }
}

// [doc:fallback-register]
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback_entry>());
}
// [/doc:fallback-register]

// [doc:fallback-forced]
// The operators of the policy table marked kRouteToFallback: PyTorch has a
// generic kernel for them that backends inherit, and the table says why the
// CPU kernel is better here.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const OpPolicyRow& row : op_policy_table()) {
    if ((row.policy & kRouteToFallback) != 0) {
      const std::string name(row.op.substr(row.op.find("::") + 2));
      m.impl(name.c_str(),
             torch::CppFunction::makeFromBoxedFunction<&fallback_entry>());
    }
  }
}
// [/doc:fallback-forced]

int route_generic_ops_to_fallback();

// Then the layouts: the engine's layout fallback when there is one,
// otherwise a clear refusal (refuse_other_layouts).
int route_ops() {
  int routed = route_generic_ops_to_fallback();
  if (engine().route_ops != nullptr) {
    routed += engine().route_ops();
  } else {
    refuse_other_layouts();
  }
  return routed;
}

// [doc:fallback-structured]
// Two kinds of operators have a generic kernel that a backend without its
// own inherits, and that costs the host more than the fallback:
//  - structured operators (add, mul, relu, ...) have one kernel per backend
//    for their out= variant and, for the functional and in-place variants, a
//    generic one (CompositeExplicitAutogradNonFunctional): it builds a
//    TensorIterator on the device tensors to compute the result's metadata,
//    allocates the result, then calls the out= variant, which reaches the
//    fallback. The launch plan already knows the result's metadata per
//    signature (the iterator was a third of the host's cost of `x + 1`);
//  - the _foreach_ operators (the optimizers' updates) have a loop of one
//    operator per tensor: a launch per tensor where the fallback makes one
//    for the whole list (AdamW's update of 14 parameters: 140 launches, or
//    10), as CUDA's fused foreach kernels do.
// Both are routed to the fallback at module load, after every static
// registration, when they have a CPU kernel and no openreg kernel (a
// vendor's own kernel always wins).
int route_generic_ops_to_fallback() {
  static torch::Library* library = nullptr;
  TORCH_INTERNAL_ASSERT(library == nullptr, "routed twice");
  library =
      new torch::Library(torch::Library::IMPL, "aten",
                         c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  int routed = 0;
  for (const c10::OperatorName& name :
       c10::Dispatcher::singleton().getAllOpNames()) {
    const std::optional<c10::OperatorHandle> op =
        c10::Dispatcher::singleton().findOp(name);
    if (!op || name.getNamespace() != std::string_view("aten") ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    const bool structured =
        op->hasKernelForDispatchKey(
            c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
    if (!(structured || is_foreach_loop(*op)) ||
        // index.Tensor: the generic kernel's checks refuse a CPU tensor
        // indexed with device indices, which the fallback would accept.
        (op_traits(*op).policy & kAcceptsCpuTensors) != 0) {
      continue;
    }
    std::string short_name = name.name.substr(name.name.find("::") + 2);
    if (!name.overload_name.empty()) {
      short_name += "." + name.overload_name;
    }
    if (engine().register_unboxed == nullptr ||
        !engine().register_unboxed(*library, short_name.c_str(), *op)) {
      library->impl(
          short_name.c_str(),
          torch::CppFunction::makeFromBoxedFunction<&fallback_entry>());
    }
    ++routed;
  }
  return routed;
}
// [/doc:fallback-structured]

}  // namespace openreg
