// Device-level functions of the PyTorch layer: device count, current device,
// and the checks that turn a bad index into a clear error.
#pragma once

#include <c10/core/Device.h>
#include <openreg.h>

#include <string>

namespace openreg {

// The most devices the PyTorch layer handles: per-device tables (streams,
// allocator caches, generators) are sized by it. device_count() never
// reports more, whatever the driver says.
constexpr c10::DeviceIndex kMaxDevices = OR_MAX_DEVICES;

// Number of devices (at most kMaxDevices); 0 if the runtime cannot start
// (never throws).
c10::DeviceIndex device_count() noexcept;
// Throws with the valid range if `device` is not a device of this machine.
[[noreturn]] void raise_invalid_device(c10::DeviceIndex device);
inline void check_device_index(c10::DeviceIndex device) {
  if (C10_UNLIKELY(device < 0 || device >= device_count())) {
    raise_invalid_device(device);
  }
}
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex device);
// Sets `device` current and returns the previous one.
c10::DeviceIndex exchange_device(c10::DeviceIndex device);
// CUDA only switches when the target already has a context; every openreg
// device is ready once the runtime is, so this equals exchange_device.
c10::DeviceIndex maybe_exchange_device(c10::DeviceIndex device);
// Sets the device without throwing (for destructors); warns on failure.
void unchecked_set_device(c10::DeviceIndex device) noexcept;
// Initialises the runtime, or throws (bad environment, forked child).
void lazy_init();
bool is_initialized() noexcept;
// True in a child forked after initialisation.
bool is_in_bad_fork() noexcept;

// [doc:host-kernels]
// True when the driver runs host closures as kernels (orLaunchKernelEx) and
// gives kernel pointers to device memory (orGetKernelPointer): the thread
// driver, whose devices live in this process. False under a driver whose
// devices run in their own processes (OPENREG_DRIVER=process), which runs
// named kernels only (orLaunchFunction): then a queued fallback call goes to
// the device as a serialized boxed call, a synchronous one stages its tensors
// through host memory (engine/OpenRegKernelView.h), and kernels not yet ported
// to named kernels raise NotImplementedError (docs/process-driver.md).
// Known once the runtime is initialised (lazy_init). False too in a build
// without an engine (core/OpenRegEngine.h), with either driver.
bool host_kernels_supported() noexcept;
// [/doc:host-kernels]

// torch.openreg.set_sync_debug_mode, as CUDA's: 0 (default) lets host
// synchronizations pass silently, 1 warns, 2 raises. Thread-safe.
void set_sync_debug_mode(int mode);
int get_sync_debug_mode() noexcept;
// Called where an operation makes the host wait for the device in a way a
// GPU would too (`what` names it): warns or raises per the mode.
void warn_or_error_on_sync(const char* what);
// How warn_or_error_on_sync names the Python-level call (the Python module
// installs it; "" when it cannot tell).
void set_sync_caller_hook(std::string (*hook)());

// True when OPENREG_LAUNCH_BLOCKING=1: every kernel has run when its launch
// returns, and a failure is raised at the launch.
bool launch_blocking();

// Makes `device` current for the lifetime of the object (raw runtime calls,
// for code below the c10 guard).
class ScopedDevice {
 public:
  explicit ScopedDevice(c10::DeviceIndex device)
      : previous_(exchange_device(device)) {}
  ~ScopedDevice() { unchecked_set_device(previous_); }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  c10::DeviceIndex previous_;
};

}  // namespace openreg
