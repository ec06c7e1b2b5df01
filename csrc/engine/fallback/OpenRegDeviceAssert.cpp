#include "engine/fallback/OpenRegDeviceAssert.h"

#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <optional>
#include <vector>

#include "aten/fallback/OpenRegIValue.h"
#include "core/OpenRegDeviceAsserts.h"
#include "core/OpenRegFunctions.h"
#include "engine/fallback/OpenRegLaunchPlan.h"
#include "kernels/OpenRegDeviceAssertOps.h"

namespace openreg {

// [doc:defer-device-assert]
bool defer_device_assert(const OpTraits& traits, torch::jit::Stack* stack,
                         c10::Device device, const std::string& what) {
  if (!cuda_device_asserts() || !asserts_on_device(traits.display_name) ||
      what.find("torch.openreg.faults") != std::string::npos) {
    return false;
  }
  const size_t num_args = traits.writes.size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, num_args);
  // Fine on Meta tensors: the host's checks (shapes, dtypes, devices) pass,
  // so on CUDA the kernel was launched and asserted on a value.
  const std::optional<std::vector<c10::IValue>> meta =
      meta_results(traits, args);
  if (!meta.has_value() || meta->size() != traits.return_arg.size()) {
    return false;
  }
  if (launch_blocking()) {
    trigger_device_assert(device.index(), traits.display_name, what);
    throw c10::AcceleratorError(
        {__func__, __FILE__, __LINE__}, 710,
        device_assert_message(device.index(), traits.display_name, what));
  }
  // The results first (the device refuses allocations once it is unusable).
  std::vector<c10::IValue> results;
  for (size_t r = 0; r < meta->size(); ++r) {
    const int arg = traits.return_arg[r];
    if (arg >= 0) {
      results.push_back(args[static_cast<size_t>(arg)]);
      continue;
    }
    results.push_back(map_tensors((*meta)[r], [&](const at::Tensor& t) {
      return t.defined() ? at::empty_strided(t.sizes(), t.strides(),
                                             t.options().device(device))
                         : t;
    }));
  }
  trigger_device_assert(device.index(), traits.display_name, what);
  torch::jit::drop(*stack, num_args);
  for (c10::IValue& v : results) {
    stack->push_back(std::move(v));
  }
  return true;
}
// [/doc:defer-device-assert]

}  // namespace openreg
