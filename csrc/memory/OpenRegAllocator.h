// Device and pinned-host allocators of the PyTorch layer.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <string>
#include <vector>

namespace openreg {

// The caching allocator registered for PrivateUse1 (what torch.empty(...,
// device="openreg") uses). Allocates on the calling thread's current device
// and current stream. See OpenRegCachingAllocator.cpp for the policy.
c10::DeviceAllocator* device_allocator();

// Caps what the caching allocator may reserve on `device` to fraction *
// capacity (torch.openreg.set_per_process_memory_fraction).
void set_memory_fraction(double fraction, c10::DeviceIndex device);
double get_memory_fraction(c10::DeviceIndex device);

// What torch.openreg.memory_snapshot() reports, in torch.cuda's shape.
struct BlockSnapshot {
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  std::string state;  // active_allocated, active_pending_free, inactive
};

struct SegmentSnapshot {
  c10::DeviceIndex device = 0;
  uintptr_t address = 0;
  size_t total_size = 0;
  size_t allocated_size = 0;
  size_t active_size = 0;
  size_t requested_size = 0;
  int64_t stream = 0;
  bool is_small = false;
  std::vector<BlockSnapshot> blocks;
};

std::vector<SegmentSnapshot> memory_snapshot();

// The caching pinned host allocator (tensor.pin_memory(), DataLoader pinning).
at::HostAllocator* host_allocator();

// True if p points into pinned memory from the runtime.
bool is_pinned_ptr(const void* p);

}  // namespace openreg
