// How device work runs: the execution model of openreg, in two functions.
//
// launch_async() enqueues `kernel` on the current stream of `device` and
// returns: it runs later on the stream's worker, in stream order. A kernel
// captures what it needs by value: device tensors as non-owning handles
// (borrowed_alias in OpenRegKernelView.h), CPU tensors as snapshots; it never
// touches Python objects. `op` names it if it throws; the error is raised at
// the next synchronization (OpenRegSynchronize.h).
// With OPENREG_LAUNCH_BLOCKING=1 every launch runs at once and waits.
//
// run_sync() is for work whose result the host needs now (copies to the
// host, ops whose output shape depends on the data, ops returning scalars):
// it waits for the stream's queued work (raising any deferred error), then
// runs `kernel` on the calling thread.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <utility>

#include "core/OpenRegStream.h"
#include "profiler/OpenRegProfiler.h"

namespace openreg {

void launch_async(c10::DeviceIndex device, std::string op,
                  std::function<void()> kernel);

template <typename F>
void run_sync(c10::DeviceIndex device, F&& kernel) {
  getCurrentStream(device).synchronize();
  const profiler::InlineKernel trace(device);
  std::forward<F>(kernel)();
}

// True when OPENREG_LAUNCH_BLOCKING=1.
bool launch_blocking();

}  // namespace openreg
