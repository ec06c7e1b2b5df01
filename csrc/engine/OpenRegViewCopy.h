// SIMULATOR ONLY. The engine's copies that are more than bytes
// (engine().copy, core/OpenRegEngine.h): PyTorch's CPU copy kernel on the
// device memory itself.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace openreg {

// `queue`: a same-device copy queued on the stream as the serialized call
// aten::copy_(dst, src) (the kernel library's openreg_boxed_call, with
// either driver); false when the call cannot be written as bytes. Otherwise
// the CPU kernel over kernel views of both sides, run synchronously
// (broadcasting, strides, dtype conversion in one pass); always true.
bool view_copy(const at::Tensor& src, const at::Tensor& dst,
               c10::DeviceIndex device, bool queue);

}  // namespace openreg
