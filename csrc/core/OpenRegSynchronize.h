// Host synchronization with the device: the one place where the host waits
// for device work, raises the errors of kernels that failed asynchronously,
// and reports the synchronization to the stream sanitizer.
//
// Every wait of the PyTorch layer goes through these functions (streams,
// devices, events, copies to pageable memory, run_sync); nothing else calls
// the runtime's synchronize functions. Thread-safe.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <openreg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace openreg {

// Deferred kernel errors. A kernel that fails on a stream's worker records
// its message here (`op` names the operator); the next synchronization of the
// stream, or of its device, raises it as a c10::Error naming the op.
void record_kernel_failure(orStream_t stream, const std::string& op,
                           const char* what);

// Deferred kernel warnings: a warning a kernel raises on a stream's worker
// is kept and raised, unchanged, at the next synchronization of the stream
// or its device (on the synchronizing thread, so Python sees it). Warnings
// of the device itself (orKernelContext::warn: kernels that warn on purpose)
// are raised at any synchronization of their device too.
void record_kernel_warning(orStream_t stream, const c10::Warning& warning);

// Marks, for its scope, a synchronization that is the call's own wait (a
// kernel that runs synchronously: its failure is raised at the call, and
// the error's hint says so instead of pointing at asynchronous launches).
class CallsOwnWait {
 public:
  CallsOwnWait();
  ~CallsOwnWait();
  CallsOwnWait(const CallsOwnWait&) = delete;
  CallsOwnWait& operator=(const CallsOwnWait&) = delete;

 private:
  bool previous_;
};

// Marks, for its scope, waits that exist only because of how openreg runs
// work (a signature's first run, a blocking launch under
// OPENREG_LAUNCH_BLOCKING=1): they order nothing the program asked for, so
// the stream sanitizer is not told of them, and blocking launches do not
// hide a race the sanitizer finds without them (CUDA's sanitizer sees no
// synchronization in CUDA_LAUNCH_BLOCKING=1 either).
class InternalWait {
 public:
  InternalWait();
  ~InternalWait();
  InternalWait(const InternalWait&) = delete;
  InternalWait& operator=(const InternalWait&) = delete;

 private:
  bool previous_;
};

// Waits until all work queued on `stream` (a stream of `device`, id `id`)
// has finished; raises the deferred errors of that stream.
void synchronize_stream(orStream_t stream, c10::DeviceIndex device, int64_t id);
// Waits for every stream of `device`; raises their deferred errors.
void synchronize_device(c10::DeviceIndex device);
// Waits until `event` has completed (a never-recorded event is complete).
void synchronize_event(orEvent_t event);

// How the host waits. The Python module installs a hook that releases the
// GIL around each wait when the waiting thread holds it, so that device work
// needing the GIL (a CPU kernel written in Python, run through the fallback)
// can run meanwhile. `wait(arg)` does the waiting; the hook must call it once.
using HostWaitHook = void (*)(void (*wait)(void*), void* arg);
void set_host_wait_hook(HostWaitHook hook);

// Synchronization trace for the stream sanitizer: when set, every event
// record/wait and every host synchronization is reported. kind is one of
// "record" (event, stream, device), "wait" (event, stream, device),
// "sync_event" (event), "sync_stream" (stream, device), "sync_device"
// (device), "elapsed" (the end event of an Event.elapsed_time). The function
// must not throw, but for "elapsed" (trace_elapsed), whose exception is the
// sanitizer's report and reaches the caller.
using SyncTraceFn = void (*)(const char* kind, int64_t event, int64_t stream,
                             int64_t device);
void set_sync_trace(SyncTraceFn fn);
void trace_sync(const char* kind, int64_t event, int64_t stream,
                int64_t device);
// Event.elapsed_time(start, end): the sanitizer checks that the host
// synchronized with `end` (may throw).
void trace_elapsed(int64_t end_event);

}  // namespace openreg
