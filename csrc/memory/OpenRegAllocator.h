// Device and pinned-host allocators of the PyTorch layer.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

namespace openreg {

// The allocator registered for PrivateUse1 (what torch.empty(...,
// device="openreg") uses). Allocates on the calling thread's current device.
c10::DeviceAllocator* device_allocator();

// The pinned host allocator (what tensor.pin_memory() uses).
c10::Allocator* host_allocator();

// True if p points into pinned memory from the runtime.
bool is_pinned_ptr(const void* p);

}  // namespace openreg
