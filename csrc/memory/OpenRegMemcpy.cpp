#include "memory/OpenRegMemcpy.h"

#include "core/OpenRegException.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegInterrupt.h"
#include "profiler/OpenRegProfiler.h"

namespace openreg {

namespace {

bool is_pinned_range(const void* p) {
  orPointerAttributes attr;
  return orPointerGetAttributes(&attr, p) == orSuccess &&
         attr.type == orMemoryTypeHost;
}

}  // namespace

// [doc:memcpy-choke-point]
void memcpy_on_stream(void* dst, const void* src, size_t nbytes,
                      orMemcpyKind kind, const OpenRegStream& stream) {
  if (nbytes == 0) {
    return;
  }
  faults::check_not_poisoned(stream.device_index());
  const bool pageable =
      (kind == orMemcpyHostToDevice && !is_pinned_range(src)) ||
      (kind == orMemcpyDeviceToHost && !is_pinned_range(dst));
  // A small copy from pageable memory to the device travels in the command
  // and waits for nothing (openreg.h, OR_MAX_INLINE_COPY_BYTES).
  const bool inline_copy =
      kind == orMemcpyHostToDevice && nbytes <= OR_MAX_INLINE_COPY_BYTES;
  if (pageable && !inline_copy) {
    // Wait here rather than inside the runtime, so that a kernel that failed
    // on the stream is raised by name. Nothing of this copy is queued yet:
    // the user's Ctrl-C may end the wait (t.cpu() after a long kernel).
    const InterruptibleWait interruptible;
    stream.synchronize();
  }
  const profiler::QueuedCopy trace(stream.unwrap(), kind, !pageable);
  OPENREG_CHECK(orMemcpyAsync(dst, src, nbytes, kind, stream.native()));
}
// [/doc:memcpy-choke-point]

void memcpy_blocking(void* dst, const void* src, size_t nbytes,
                     orMemcpyKind kind, const OpenRegStream& stream) {
  memcpy_on_stream(dst, src, nbytes, kind, stream);
  if (nbytes != 0) {
    stream.synchronize();
  }
}

c10::DeviceIndex device_of_pointer(const void* ptr) {
  orPointerAttributes attr;
  OPENREG_CHECK(orPointerGetAttributes(&attr, ptr));
  TORCH_CHECK(attr.type == orMemoryTypeDevice, "The pointer ", ptr,
              " is not openreg device memory");
  return static_cast<c10::DeviceIndex>(attr.device);
}

}  // namespace openreg
