#include "engine/OpenRegViewCopy.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>

#include "aten/OpenRegLaunch.h"
#include "engine/OpenRegKernelView.h"
#include "engine/fallback/OpenRegCallEncoder.h"

namespace openreg {

bool view_copy(const at::Tensor& src, const at::Tensor& dst,
               c10::DeviceIndex device, bool queue) {
  if (queue) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    const std::array<c10::IValue, 3> args{dst, src, false};
    return launch_boxed_call(device, "aten::copy_", op, args, {}, dst.numel());
  }
  run_sync(device, [&] {
    KernelViews views;
    const auto on_device = [](const at::Tensor& t) {
      return t.device().type() == c10::DeviceType::PrivateUse1;
    };
    at::Tensor src_view = on_device(src) ? views.view(src) : src;
    at::Tensor dst_view = on_device(dst) ? views.view(dst) : dst;
    dst_view.copy_(src_view);
  });
  return true;
}

}  // namespace openreg
