// How kernels reach device memory.
//
// A kernel body sees each device tensor as a CPU tensor over the kernel view
// of the same bytes (same sizes, strides, storage offset): PyTorch's CPU
// kernels then read and write device memory in place, with no copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/OpenRegException.h"
#include "core/OpenRegStream.h"
#include "profiler/OpenRegProfiler.h"

namespace openreg {

// The kernel address of a device storage's first byte (nullptr if empty).
void* kernel_base(const c10::Storage& storage);

// The kernel views of one kernel launch.
//
// Each device tensor becomes a CPU tensor aliasing its device memory through
// the kernel view. Tensors that share a device storage get views that share
// one CPU storage, so PyTorch's overlap checks see the aliasing exactly as on
// the CPU. A view made `resizable` (an out= argument) may be grown by the
// kernel: it then moves to host memory and the caller must copy it back.
class KernelViews {
 public:
  at::Tensor view(const at::Tensor& t, bool resizable = false);

  // The device storage whose kernel view a CPU tensor's storage is, or
  // nullptr if it is none of this launch's.
  const c10::Storage* device_storage_of(const at::Tensor& cpu) const;

 private:
  struct Entry {
    c10::StorageImpl* device;  // key
    c10::Storage device_storage;
    c10::Storage cpu_storage;
    void* base;  // kernel address the CPU storage started at
  };
  std::vector<Entry> entries_;
};

// A device tensor over the same memory and metadata as `t` that does not own
// the memory (what an asynchronous kernel captures).
at::Tensor borrowed_alias(const at::Tensor& t);

// A single kernel view (for a launch with one device tensor).
at::Tensor kernel_view(const at::Tensor& t, bool resizable = false);

// Copies a CPU tensor made by a kernel into new memory on `device`, ordered
// on the device's current stream.
at::Tensor copy_to_device(const at::Tensor& cpu, c10::Device device);

// A device tensor over `storage` with the metadata (sizes, strides, offset,
// dtype, conj/neg bits) of `like`, a kernel view of that same storage.
at::Tensor device_alias(const c10::Storage& storage, const at::Tensor& like);

// How device work runs (see OpenRegLaunch.cpp for the model).
//
// launch_async() enqueues `kernel` on the current stream of `device` and
// returns: it runs later on the stream's worker, in stream order. `op` names
// it if it throws; the error is raised at the next synchronization.
// With OPENREG_LAUNCH_BLOCKING=1 every launch runs at once and waits.
void launch_async(c10::DeviceIndex device, std::string op,
                  std::function<void()> kernel);

// run_sync() is for work whose result the host needs now (copies to the
// host, ops whose output shape depends on the data, ops returning scalars):
// it waits for the stream's queued work (raising any deferred error), then
// runs `kernel` on the calling thread.
template <typename F>
void run_sync(c10::DeviceIndex device, F&& kernel) {
  getCurrentStream(device).synchronize();
  const profiler::InlineKernel trace(device);
  std::forward<F>(kernel)();
}

// The operators that have run through the CPU fallback so far, and the
// switch for its once-per-operator warning (OpenRegFallback.cpp).
std::vector<std::string> fallback_ops();
void set_fallback_warnings(bool enabled);

// True when OPENREG_LAUNCH_BLOCKING=1.
bool launch_blocking();

}  // namespace openreg
