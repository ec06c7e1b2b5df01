// The hooks of OpenRegProfiler.h: each execution path records its device
// work in the collector while a session records.
//
// SIMULATOR ONLY: the device side of a record is timed by reading the host
// clock on the stream's worker (a wrapper around each queued kernel, and the
// timestamp kernels queued around each copy). A real device's profiler takes
// these times from the driver's activity records (CUPTI's role) and keeps
// only the host side here.
//
// A device that runs named kernels only (OPENREG_DRIVER=process) takes no
// host closure: there the stamps are the kernel library's
// openreg_profiler_stamp, queued before and after each named kernel and
// copy, storing the device's clock in pinned memory that the collector
// reads when the session stops, the way a device writes its timer.
#include <memory>

#include "core/OpenRegFunctions.h"
#include "core/OpenRegNamedKernels.h"
#include "core/OpenRegStream.h"
#include "profiler/OpenRegProfiler.h"
#include "profiler/OpenRegProfilerCollector.h"

namespace openreg::profiler {

namespace {

// Kept by a wrapped kernel (and its copies): the in-flight count is
// released when the runtime destroys the task, whether it ran or not.
struct InFlight {
  InFlight() { collector().enter(); }
  ~InFlight() {
    without_throwing("the end of a kernel", [] { collector().leave(); });
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
};

// Times the wrapped kernel on the worker, even if it throws.
struct DeviceSpan {
  uint32_t flow;
  int64_t begin = now_ns();
  ~DeviceSpan() {
    without_throwing("a kernel's device time", [this] {
      collector().device_span(flow, begin, now_ns());
    });
  }
};

// The timestamps queued around a copy; called by the stream's worker
// through the runtime's C ABI, so nothing may escape. They run on the worker
// alone.
constexpr orLaunchAttributes kOneThread{1};

int stamp_begin(void* data) {
  const auto flow = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(data));
  without_throwing("a copy's device start",
                   [&] { collector().device_span(flow, now_ns(), 0); });
  return 0;
}

int stamp_end(void* data) {
  const auto flow = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(data));
  without_throwing("a copy's device end", [&] {
    collector().device_span(flow, 0, now_ns());
    collector().leave();
  });
  return 0;
}

// Queues a stamp of the device's clock into `slot` on `stream`. A stamp
// that cannot be queued leaves the record without a device part.
void queue_stamp(orStream_t stream, int64_t* slot) {
  const auto address = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(slot));
  (void)orLaunchFunction(stream, named_kernel(NamedKernel::kStamp), &address,
                         sizeof(address), &kOneThread);
}

void* as_data(uint32_t flow) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(flow));
}

const char* copy_name(orMemcpyKind kind, bool pinned) {
  switch (kind) {
    case orMemcpyHostToDevice:
      return pinned ? "Memcpy HtoD (Pinned -> openreg)"
                    : "Memcpy HtoD (Pageable -> openreg)";
    case orMemcpyDeviceToHost:
      return pinned ? "Memcpy DtoH (openreg -> Pinned)"
                    : "Memcpy DtoH (openreg -> Pageable)";
    case orMemcpyDeviceToDevice:
      return "Memcpy DtoD (openreg -> openreg)";
    default:
      return "Memcpy";
  }
}

}  // namespace

// [doc:queued-kernel]
void QueuedKernel::begin(const c10::Stream& stream, const std::string& op,
                         KernelBody& kernel) {
  const int64_t t = now_ns();
  const uint32_t flow = collector().launched(Work::kKernel, stream, op, t);
  kernel = [inner = std::move(kernel), flow,
            token = std::make_shared<InFlight>()]() mutable {
    const DeviceSpan span{flow};
    inner();
  };
  flow_ = flow;
}

void QueuedKernel::end() noexcept {
  without_throwing("a kernel launch's end",
                   [this] { collector().launch_returned(flow_, now_ns()); });
}
// [/doc:queued-kernel]

void QueuedFunction::begin(const c10::Stream& stream, const std::string& op) {
  const int64_t t = now_ns();
  const uint32_t flow = collector().launched(Work::kKernel, stream, op, t);
  stream_ = native_stream(stream);
  stamps_ = collector().stamp_pair(flow);
  if (stamps_ != nullptr) {
    queue_stamp(stream_, &stamps_[0]);
  }
  flow_ = flow;
}

void QueuedFunction::end() noexcept {
  without_throwing("a kernel launch's end", [this] {
    if (stamps_ != nullptr) {
      queue_stamp(stream_, &stamps_[1]);
    }
    collector().launch_returned(flow_, now_ns());
  });
}

void QueuedCopy::begin(const c10::Stream& stream, orMemcpyKind kind,
                       bool pinned) {
  const int64_t t = now_ns();
  const uint32_t flow =
      collector().launched(Work::kCopy, stream, copy_name(kind, pinned), t);
  stream_ = native_stream(stream);
  if (!host_kernels_supported()) {
    stamps_ = collector().stamp_pair(flow);
    if (stamps_ != nullptr) {
      queue_stamp(stream_, &stamps_[0]);
    }
  } else {
    // A failed stamp leaves the record without a device part; the copy
    // itself is unaffected.
    (void)orLaunchKernelEx(stream_, &stamp_begin, as_data(flow), &kOneThread);
    collector().enter();
  }
  flow_ = flow;
}

void QueuedCopy::end() noexcept {
  without_throwing("a copy launch's end", [this] {
    if (stamps_ != nullptr) {
      queue_stamp(stream_, &stamps_[1]);
    } else if (host_kernels_supported()) {
      if (orLaunchKernelEx(stream_, &stamp_end, as_data(flow_), &kOneThread) !=
          orSuccess) {
        collector().leave();  // no stamp will leave for it
      }
    }
    collector().launch_returned(flow_, now_ns());
  });
}

void InlineKernel::begin(c10::DeviceIndex device) {
  const c10::Stream stream = getCurrentStream(device).unwrap();
  const int64_t t = now_ns();
  flow_ = collector().launched(Work::kInline, stream, std::string(), t);
}

void InlineKernel::end() noexcept {
  const int64_t t = now_ns();
  without_throwing("inline work's end", [this, t] {
    Collector& c = collector();
    c.launch_returned(flow_, t);
    c.device_span(flow_, 0, t);
  });
}

}  // namespace openreg::profiler
