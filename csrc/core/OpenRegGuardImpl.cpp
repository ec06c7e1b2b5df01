#include "core/OpenRegGuardImpl.h"

#include <c10/core/CachingDeviceAllocator.h>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegInterrupt.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"

namespace openreg {

namespace {

orEvent_t as_event(void* event) { return static_cast<orEvent_t>(event); }

}  // namespace

OpenRegGuardImpl::OpenRegGuardImpl(c10::DeviceType t) {
  TORCH_INTERNAL_ASSERT(t == static_type, "OpenRegGuardImpl made for ", t);
}

c10::DeviceType OpenRegGuardImpl::type() const { return static_type; }

// [doc:guard-device]
c10::Device OpenRegGuardImpl::exchangeDevice(c10::Device d) const {
  TORCH_INTERNAL_ASSERT(d.type() == static_type);
  return c10::Device(static_type, exchange_device(d.index()));
}

c10::Device OpenRegGuardImpl::getDevice() const {
  return c10::Device(static_type, current_device());
}

void OpenRegGuardImpl::setDevice(c10::Device d) const {
  TORCH_INTERNAL_ASSERT(d.type() == static_type);
  set_device(d.index());
}

void OpenRegGuardImpl::uncheckedSetDevice(c10::Device d) const noexcept {
  unchecked_set_device(d.index());
}
// [/doc:guard-device]

// [doc:guard-streams]
c10::Stream OpenRegGuardImpl::getStream(c10::Device d) const {
  return getCurrentStream(d.index()).unwrap();
}

c10::Stream OpenRegGuardImpl::getDefaultStream(c10::Device d) const {
  return openreg::getDefaultStream(d.index()).unwrap();
}

c10::Stream OpenRegGuardImpl::getStreamFromGlobalPool(
    c10::Device d, bool isHighPriority) const {
  return getStreamFromPool(isHighPriority, d.index()).unwrap();
}

c10::Stream OpenRegGuardImpl::getNewStream(c10::Device d, int priority) const {
  return openreg::getNewStream(d.index(), priority).unwrap();
}

c10::Stream OpenRegGuardImpl::exchangeStream(c10::Stream s) const {
  OpenRegStream previous = getCurrentStream(s.device_index());
  setCurrentStream(OpenRegStream(s));
  return previous.unwrap();
}

void* OpenRegGuardImpl::getStreamNativeHandle(const c10::Stream s) const {
  return native_stream(s);
}
// [/doc:guard-streams]

void OpenRegGuardImpl::destroyEvent(
    void* event, const c10::DeviceIndex /*device_index*/) const noexcept {
  if (event != nullptr) {
    OPENREG_CHECK_WARN(orEventDestroy(as_event(event)));
  }
}

// [doc:event-record]
void OpenRegGuardImpl::record(void** event, const c10::Stream& stream,
                              const c10::DeviceIndex device_index,
                              const c10::EventFlag flag) const {
  TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
              "Event device index ", static_cast<int>(device_index),
              " does not match recording stream's device index ",
              static_cast<int>(stream.device_index()), ".");
  if (*event == nullptr) {
    // As CUDA: PyTorch's default flag disables timing; enable_timing=True
    // asks for the backend default, which records timestamps.
    unsigned int flags = flag == c10::EventFlag::BACKEND_DEFAULT
                             ? orEventDefault
                             : orEventDisableTiming;
    ScopedDevice guard(stream.device_index());
    orEvent_t created = nullptr;
    OPENREG_CHECK(orEventCreateWithFlags(&created, flags));
    *event = created;
  }
  OPENREG_CHECK(orEventRecord(as_event(*event), native_stream(stream)));
  trace_sync("record", reinterpret_cast<int64_t>(*event), stream.id(),
             stream.device_index());
}
// [/doc:event-record]

// [doc:event-wait-query]
void OpenRegGuardImpl::block(void* event, const c10::Stream& stream) const {
  if (event == nullptr) {
    return;  // never recorded: nothing to wait for
  }
  OPENREG_CHECK(orStreamWaitEvent(native_stream(stream), as_event(event)));
  trace_sync("wait", reinterpret_cast<int64_t>(event), stream.id(),
             stream.device_index());
}

bool OpenRegGuardImpl::queryEvent(void* event) const {
  if (event == nullptr) {
    return true;
  }
  orError_t err = orEventQuery(as_event(event));
  if (err == orErrorNotReady) {
    return false;
  }
  OPENREG_CHECK(err);
  return true;
}

void OpenRegGuardImpl::synchronizeEvent(void* event) const {
  const InterruptibleWait interruptible;  // the user's wait: Ctrl-C ends it
  synchronize_event(as_event(event));
}
// [/doc:event-wait-query]

// [doc:event-elapsed]
double OpenRegGuardImpl::elapsedTime(
    void* event1, void* event2, const c10::DeviceIndex /*device_index*/) const {
  TORCH_CHECK(event1 != nullptr && event2 != nullptr,
              "Both events must be recorded before calculating elapsed time.");
  trace_elapsed(reinterpret_cast<int64_t>(event2));  // the stream sanitizer
  float ms = 0;
  orError_t err = orEventElapsedTime(&ms, as_event(event1), as_event(event2));
  TORCH_CHECK(err != orErrorInvalidEventTiming,
              "Both events must be created with enable_timing=True and "
              "recorded before calculating elapsed time.");
  TORCH_CHECK(err != orErrorNotReady,
              "Both events must have completed before calculating elapsed "
              "time (call synchronize() first).");
  OPENREG_CHECK(err);
  return static_cast<double>(ms);
}
// [/doc:event-elapsed]

c10::DeviceIndex OpenRegGuardImpl::deviceCount() const noexcept {
  return device_count();
}

c10::DeviceCapability OpenRegGuardImpl::getDeviceCapability(
    c10::Device d) const {
  check_device_index(d.index());
  // The simulator computes with the host's kernels: every dtype the CPU
  // supports is supported.
  return c10::DeviceCapability();
}

// [doc:guard-sync]
bool OpenRegGuardImpl::queryStream(const c10::Stream& stream) const {
  return OpenRegStream(stream).query();
}

void OpenRegGuardImpl::synchronizeStream(const c10::Stream& stream) const {
  warn_or_error_on_sync("Stream.synchronize()");
  const InterruptibleWait interruptible;
  OpenRegStream(stream).synchronize();
}

void OpenRegGuardImpl::synchronizeDevice(
    const c10::DeviceIndex device_index) const {
  const InterruptibleWait interruptible;
  synchronize_device(device_index < 0 ? current_device() : device_index);
}

void OpenRegGuardImpl::recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                                             const c10::Stream& stream) const {
  // Delegated to the device allocator, which owns block reuse; reached
  // through c10's registry, so core/ does not depend on memory/.
  c10::getDeviceAllocator(static_type)->recordStream(data_ptr, stream);
}
// [/doc:guard-sync]

// [doc:guard-register]
C10_REGISTER_GUARD_IMPL(PrivateUse1, OpenRegGuardImpl);
// [/doc:guard-register]

}  // namespace openreg
