// The device's copy engine, shared by both drivers: memory.cpp (thread
// driver) and device_main.cpp (a device process of the process driver).
#pragma once

#include <cstddef>

namespace openreg_device {

// Copies `n` bytes from `src` to `dst` as the device's copy engine does
// ("bulk-copy" in bulk_copy.cpp). The ranges may overlap.
void copy_bytes(char* dst, const char* src, size_t n);

}  // namespace openreg_device
