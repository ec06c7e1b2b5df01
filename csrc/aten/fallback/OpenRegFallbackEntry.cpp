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

#include "aten/fallback/OpenRegCopyingFallback.h"
#include "aten/fallback/OpenRegIValue.h"
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

namespace {

void fallback_entry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (engine().fallback != nullptr && !copying_fallback_selected()) {
    engine().fallback(op, stack);
  } else {
    copying_fallback(op, stack);
  }
}

}  // namespace

// [doc:fallback-register]
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback_entry>());
}
// [/doc:fallback-register]

}  // namespace openreg
