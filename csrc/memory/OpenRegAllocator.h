// Device and pinned-host allocators of the PyTorch layer.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <optional>
#include <vector>

#include "memory/OpenRegMemoryHistory.h"

namespace openreg {

// The caching allocator registered for PrivateUse1 (what torch.empty(...,
// device="openreg") uses). Allocates on the calling thread's current device
// and current stream. See OpenRegDeviceCache.h for the cache and
// OpenRegAllocatorPolicy.h for the sizes and PYTORCH_ALLOC_CONF options.
c10::DeviceAllocator* device_allocator();

// A block of the caching allocator for use on `stream` (any thread may ask;
// nbytes > 0): what device_allocator() gives on a thread whose current
// stream is `stream`.
c10::DataPtr allocate_device_memory(size_t nbytes, c10::Stream stream);
// The same, but an empty DataPtr, at once, when it would need more than the
// free cached blocks and the free device memory (no cache is freed, nothing
// is counted).
c10::DataPtr try_allocate_device_memory(size_t nbytes, c10::Stream stream);

// What one more allocation on `device` may take (DeviceCache::free_bytes).
size_t device_free_bytes(c10::DeviceIndex device);

// Caps what the caching allocator may reserve on `device` to fraction *
// capacity (torch.openreg.set_per_process_memory_fraction).
void set_memory_fraction(double fraction, c10::DeviceIndex device);
double get_memory_fraction(c10::DeviceIndex device);

// What torch.openreg.memory_snapshot() reports: every segment of every
// device with its blocks. A segment's `stream` holds the c10::StreamId of the
// stream it belongs to (what torch.Stream.stream_id shows), not an address.
std::vector<c10::CachingDeviceAllocator::SegmentInfo> memory_snapshot();

// Allocation history for memory snapshots (OpenRegMemoryHistory.h):
// applies `settings` from now on; `clear` drops what was recorded.
void record_memory_history(const allocator::HistorySettings& settings,
                           bool clear);
// What each device recorded, oldest first (one list per device).
std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>>
memory_traces();

// The block of the caching allocator that holds device address p on
// `device`: where it starts, the bytes its owner asked for, and whether it
// is allocated now (false: freed, cached for reuse). nullopt when no segment
// of the caching allocator holds p (memory the runtime gave someone else).
struct DeviceBlockExtent {
  const char* begin;
  size_t size;
  bool allocated;
};
std::optional<DeviceBlockExtent> find_device_block(const void* p,
                                                   c10::DeviceIndex device);

// The caching pinned host allocator (tensor.pin_memory(), DataLoader pinning).
at::HostAllocator* host_allocator();

// True if p points into pinned memory from the runtime.
bool is_pinned_ptr(const void* p);

}  // namespace openreg
