// Device activity for the PyTorch profiler: the hooks the execution paths call.
//
// While a profiler session records (torch.profiler with
// ProfilerActivity.PrivateUse1, or torch.autograd.profiler.profile with
// use_device="openreg"), every piece of device work is timed where it really
// runs (queued kernels on the stream's worker, inline work on the calling
// thread) and tagged with the operator that launched it.
//
// When no session records, each hook costs one relaxed atomic load and a
// not-taken branch: no allocation, no lock, no clock read.
//
// The rest of csrc/profiler, one concern per file:
//   OpenRegProfilerHooks.cpp      these hooks: what each path records
//   OpenRegProfilerCollector.h    the records of the current session
//   OpenRegKinetoSession.cpp      the Kineto plugin turning records into
//                                 activities (built when torch ships Kineto's
//                                 headers)
//   OpenRegProfilerStubs.cpp      the legacy profiler's device events
//
// Thread-safety: every hook may be called from any thread.
#pragma once

#include <c10/core/Stream.h>
#include <c10/macros/Macros.h>
#include <openreg.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "core/OpenRegKernelBody.h"

namespace openreg::profiler {

namespace detail {
extern std::atomic<bool> g_recording;
}  // namespace detail

// True while a session records device activity.
inline bool recording() noexcept {
  return detail::g_recording.load(std::memory_order_relaxed);
}

// A kernel queued on `stream` (launch_async). Construct it before the
// runtime call that enqueues the kernel and keep it alive until that call
// has returned: it times the host side of the launch. While recording, the
// constructor replaces `kernel` by a wrapper that times the kernel when the
// worker runs it.
class QueuedKernel {
 public:
  QueuedKernel(const c10::Stream& stream, const std::string& op,
               KernelBody& kernel) {
    if (C10_UNLIKELY(recording())) {
      begin(stream, op, kernel);
    }
  }
  ~QueuedKernel() {
    if (C10_UNLIKELY(flow_ != 0)) {
      end();
    }
  }
  QueuedKernel(const QueuedKernel&) = delete;
  QueuedKernel& operator=(const QueuedKernel&) = delete;

 private:
  void begin(const c10::Stream& stream, const std::string& op,
             KernelBody& kernel);
  void end() noexcept;
  uint32_t flow_ = 0;
};

// A named kernel queued on `stream` (launch_function, the launch of a
// device that runs named kernels only). Construct it right before the
// runtime call and keep it alive until the call has returned: while
// recording it queues a device timestamp before and after the kernel.
class QueuedFunction {
 public:
  QueuedFunction(const c10::Stream& stream, const std::string& op) {
    if (C10_UNLIKELY(recording())) {
      begin(stream, op);
    }
  }
  ~QueuedFunction() {
    if (C10_UNLIKELY(flow_ != 0)) {
      end();
    }
  }
  QueuedFunction(const QueuedFunction&) = delete;
  QueuedFunction& operator=(const QueuedFunction&) = delete;

 private:
  void begin(const c10::Stream& stream, const std::string& op);
  void end() noexcept;
  uint32_t flow_ = 0;
  orStream_t stream_ = nullptr;
  int64_t* stamps_ = nullptr;
};

// A runtime copy queued on `stream` (orMemcpyAsync); `pinned`: its host side
// (if any) is pinned memory. Construct it right before the runtime call and
// keep it alive until the call has returned: while recording it enqueues a
// timestamp before and after the copy.
class QueuedCopy {
 public:
  QueuedCopy(const c10::Stream& stream, orMemcpyKind kind, bool pinned) {
    if (C10_UNLIKELY(recording())) {
      begin(stream, kind, pinned);
    }
  }
  ~QueuedCopy() {
    if (C10_UNLIKELY(flow_ != 0)) {
      end();
    }
  }
  QueuedCopy(const QueuedCopy&) = delete;
  QueuedCopy& operator=(const QueuedCopy&) = delete;

 private:
  void begin(const c10::Stream& stream, orMemcpyKind kind, bool pinned);
  void end() noexcept;
  uint32_t flow_ = 0;
  orStream_t stream_ = nullptr;
  int64_t* stamps_ = nullptr;  // a device that runs named kernels only
};

// Device work the host waits for (run_sync, OPENREG_LAUNCH_BLOCKING): the
// scope of the object, on the waiting thread, is the kernel's span on the
// device's current stream.
class InlineKernel {
 public:
  explicit InlineKernel(c10::DeviceIndex device) {
    if (C10_UNLIKELY(recording())) {
      begin(device);
    }
  }
  ~InlineKernel() {
    if (C10_UNLIKELY(flow_ != 0)) {
      end();
    }
  }
  InlineKernel(const InlineKernel&) = delete;
  InlineKernel& operator=(const InlineKernel&) = delete;

 private:
  void begin(c10::DeviceIndex device);
  void end() noexcept;
  uint32_t flow_ = 0;
};

}  // namespace openreg::profiler
