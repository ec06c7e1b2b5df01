// How device work runs: the execution model of openreg, in two functions.
//
// launch_async() enqueues `kernel` on the current stream of `device` and
// returns: it runs later on the stream's worker, in stream order. A kernel
// captures what it needs by value: device tensors as non-owning references
// (DeviceTensorRef or borrowed_alias in OpenRegKernelView.h), CPU tensors as
// snapshots; it never touches Python objects. Its closure is a KernelBody
// (core/OpenRegKernelBody.h): move-only, kept inline when small. `op` names it
// if it throws; the error is raised at the next synchronization
// (OpenRegSynchronize.h). `elements`, when known (>= 0), is the size of the
// largest tensor argument of the call: a small kernel runs on the worker
// thread alone, without an OpenMP team (OpenRegLaunch.cpp, WorkerThreads); a
// kernel's team size depends only on it and on torch.get_num_threads(), so
// identical calls give identical bits. With OPENREG_LAUNCH_BLOCKING=1 every
// launch runs at once and waits.
//
// run_sync() is for work whose result the host needs now (ops whose output
// shape depends on the data, the first run of an op signature): it waits for
// the stream's queued work (raising any deferred error), runs `kernel` on the
// stream's worker with the calling thread's state (dispatch and autograd
// modes, warning handler), waits for it and rethrows what it threw. The host
// thread never computes: a CPU kernel run on a host thread other than the
// main one would give that thread an OpenMP pool of its own, which slows
// every CPU kernel of the process (see docs/runtime.md). `elements` as for
// launch_async: a call that may also be queued passes the same value on both
// paths. `op`, when given, names the kernel for faults on demand
// (core/OpenRegFaults.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>
#include <openreg.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/OpenRegFunctions.h"  // launch_blocking
#include "core/OpenRegKernelBody.h"

namespace openreg {

void launch_async(c10::DeviceIndex device, const std::string& op,
                  KernelBody kernel, int64_t elements = -1);

void run_sync(c10::DeviceIndex device, c10::function_ref<void()> kernel,
              int64_t elements = -1, const char* op = nullptr);

// launch_function() enqueues the named kernel `function` (a kernel of the
// kernel library, core/OpenRegNamedKernels.h) with `bytes` of parameters on
// the current stream of `device` and returns; the bytes are copied at the
// call. It is the launch of a device with its own memory: nothing of the
// host crosses but the bytes, so it is the only launch the process driver
// runs. A failure the kernel reports is raised at the next synchronization
// with the kernel's message. `op` names the operator (for injected faults:
// faults.fail_kernel matches it, and faults.delay_kernels stalls the stream
// before the kernel). `elements` as for launch_async.
void launch_function(c10::DeviceIndex device, const std::string& op,
                     orFunction_t function, const void* params, size_t bytes,
                     int64_t elements = -1);

// The most threads a kernel whose largest tensor argument has `elements`
// elements (-1: unknown) may use (see "worker-threads" in OpenRegLaunch.cpp).
int kernel_thread_cap(int64_t elements);

}  // namespace openreg
