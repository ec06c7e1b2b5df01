// Byte copies to, from and within device memory: the one choke point.
//
// Every copy the PyTorch layer makes (tensor copies, resizes, the
// allocator's copy_data, results of synchronous kernels, .item()) goes
// through these functions, so each is ordered on the right stream, visible
// to the profiler, and raises deferred kernel errors by name when it waits.
// Nothing else calls orMemcpy/orMemcpyAsync.
#pragma once

#include <openreg.h>

#include <cstddef>

#include "core/OpenRegStream.h"

namespace openreg {

// Copies `nbytes` from `src` to `dst` (`kind` says which sides are device
// memory), ordered on `stream`: after the work queued there before the call
// and before the work queued after it. A copy between device memory and
// pinned host memory, or within device memory, is queued and the call
// returns at once; with pageable host memory on one side the host first
// waits for `stream` (CUDA's rule) and copies before returning.
void memcpy_on_stream(void* dst, const void* src, size_t nbytes,
                      orMemcpyKind kind, const OpenRegStream& stream);

// memcpy_on_stream(), then waits for the copy: the bytes have arrived when
// it returns.
void memcpy_blocking(void* dst, const void* src, size_t nbytes,
                     orMemcpyKind kind, const OpenRegStream& stream);

// The device a device pointer belongs to.
c10::DeviceIndex device_of_pointer(const void* ptr);

}  // namespace openreg
