// The pinned host allocator: PyTorch's generic caching host allocator
// (ATen/core/CachingHostAllocator.h) over the runtime's orMallocHost.
//
// A pinned block that an asynchronous copy still reads or writes is not
// handed out again until that copy has finished: the copy calls
// record_event() with its stream, freeing the block records an event there,
// and the block is reused once the event has completed.
#include "memory/OpenRegAllocator.h"

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"

namespace openreg {

namespace {

// An owned runtime event (move-only), the E of CachingHostAllocatorImpl.
class HostEvent {
 public:
  HostEvent() = default;
  HostEvent(HostEvent&& other) noexcept : event_(other.event_) {
    other.event_ = nullptr;
  }
  HostEvent& operator=(HostEvent&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  HostEvent(const HostEvent&) = delete;
  HostEvent& operator=(const HostEvent&) = delete;
  ~HostEvent() {
    if (event_ != nullptr) {
      OPENREG_CHECK_WARN(orEventDestroy(event_));
    }
  }

  void record(const c10::Stream& stream) {
    ScopedDevice guard(stream.device_index());
    OPENREG_CHECK(orEventCreateWithFlags(&event_, orEventDisableTiming));
    OPENREG_CHECK(orEventRecord(event_, native_stream(stream)));
  }

  bool query() const {
    orError_t err = orEventQuery(event_);
    if (err == orErrorNotReady) {
      return false;
    }
    OPENREG_CHECK(err);
    return true;
  }

 private:
  orEvent_t event_ = nullptr;
};

// [doc:host-allocator]
struct HostAllocatorImpl final
    : public at::CachingHostAllocatorImpl<c10::Stream, HostEvent> {
 private:
  void allocate_host_memory(size_t size, void** ptr) override {
    lazy_init();
    OPENREG_CHECK(orMallocHost(ptr, size));
  }

  void free_block(at::HostBlock<c10::Stream>* block) override {
    OPENREG_CHECK_WARN(orFreeHost(block->ptr_));
  }

  void record_stream(std::optional<std::vector<HostEvent>>& events,
                     c10::Stream stream) override {
    HostEvent event;
    event.record(stream);
    events->push_back(std::move(event));
  }

  bool query_event(HostEvent& event) override { return event.query(); }

  c10::Stream get_current_stream() const override {
    return getCurrentStream().unwrap();
  }

  bool stream_is_capturing(c10::Stream /*stream*/) const override {
    return false;  // openreg has no graph capture
  }
};

DECLARE_HOST_ALLOCATOR(OpenRegHostAllocator, HostAllocatorImpl,
                       openreg_host_deleter, g_host_allocator)
// [/doc:host-allocator]

}  // namespace

at::HostAllocator* host_allocator() { return &g_host_allocator; }

bool is_pinned_ptr(const void* p) {
  if (!is_initialized() || is_in_bad_fork()) {
    return false;  // nothing can be pinned before the runtime starts
  }
  orPointerAttributes attr;
  orError_t err = orPointerGetAttributes(&attr, p);
  if (err == orErrorInvalidDevicePointer) {
    return false;  // a stale device address is not pinned host memory
  }
  OPENREG_CHECK(err);
  return attr.type == orMemoryTypeHost;
}

// [doc:host-allocator-register]
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator)
// [/doc:host-allocator-register]

}  // namespace openreg
