// How kernels reach device memory.
//
// A kernel body sees each device tensor as a CPU tensor over the kernel view
// of the same bytes (same sizes, strides, storage offset): PyTorch's CPU
// kernels then read and write device memory in place, with no copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <utility>

#include "core/OpenRegException.h"
#include "core/OpenRegStream.h"

namespace openreg {

// The kernel address of a device storage's first byte (nullptr if empty).
void* kernel_base(const c10::Storage& storage);

// A CPU tensor aliasing `t`'s device memory through the kernel view. With
// `resizable`, a kernel may grow it (an out= argument): it then reallocates
// on the host and the caller must copy the result back to the device.
at::Tensor kernel_view(const at::Tensor& t, bool resizable = false);

// A device tensor over `storage` with the metadata (sizes, strides, offset,
// dtype, conj/neg bits) of `like`, a kernel view of that same storage.
at::Tensor device_alias(const c10::Storage& storage, const at::Tensor& like);

// Runs `kernel` as device work on the current stream of `device`.
//
// Execution model of this version: the kernel runs on the calling thread
// after the work already queued on the stream (stream order holds), and has
// finished when launch() returns. Every caller goes through here, so making
// execution asynchronous changes this function, not the kernels.
template <typename F>
void launch(c10::DeviceIndex device, F&& kernel) {
  orStream_t stream = getCurrentStream(device).native();
  if (orStreamQuery(stream) == orErrorNotReady) {
    OPENREG_CHECK(orStreamSynchronize(stream));
  }
  std::forward<F>(kernel)();
}

}  // namespace openreg
