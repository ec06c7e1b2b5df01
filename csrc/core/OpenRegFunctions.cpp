#include "core/OpenRegFunctions.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/OpenRegDeviceAsserts.h"
#include "core/OpenRegEngine.h"
#include "core/OpenRegException.h"
#include "core/OpenRegInterrupt.h"

namespace openreg {

namespace {

// [doc:lazy-init]
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};
std::atomic<bool> g_host_kernels{true};

void on_fork_child() {
  if (g_initialized.load()) {
    g_bad_fork.store(true);
  }
}

}  // namespace

bool is_in_bad_fork() noexcept { return g_bad_fork.load(); }

bool is_initialized() noexcept { return g_initialized.load(); }

bool host_kernels_supported() noexcept {
  return g_host_kernels.load(std::memory_order_acquire);
}

namespace {

void check_settings() {
  // The switches of this layer take 0 or 1 (unset or empty: 0), as
  // CUDA_LAUNCH_BLOCKING is used: anything else is a mistake to report, not
  // a silent 0.
  for (const char* name :
       {"OPENREG_LAUNCH_BLOCKING", "OPENREG_FALLBACK_WARNINGS"}) {
    const char* env = std::getenv(name);
    TORCH_CHECK(env == nullptr || env[0] == '\0' ||
                    std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0,
                name, "='", env, "' is not 0 or 1");
  }
  cuda_device_asserts();  // reads and checks OPENREG_DEVICE_ASSERTS
}

}  // namespace

void lazy_init() {
  TORCH_CHECK(!is_in_bad_fork(),
              "Cannot re-initialize openreg in forked subprocess. To use "
              "openreg with multiprocessing, you must use the 'spawn' start "
              "method");
  if (g_initialized.load(std::memory_order_acquire)) {
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    check_settings();
    OPENREG_CHECK(orInit());
    // Does the driver run host closures? A driver whose devices run in
    // their own processes (OPENREG_DRIVER=process) runs named kernels only.
    orLaunchAttributes single{};
    single.hostThreads = 1;
    orError_t probe = orLaunchKernelEx(
        nullptr, [](void*) { return 0; }, nullptr, &single);
    if (probe == orErrorNotSupported) {
      g_host_kernels.store(false, std::memory_order_release);
      probe = orSuccess;
    }
    if (!engine().present) {
      // No engine in this build (core/OpenRegEngine.h): nothing runs host
      // code on device memory, whichever driver runs the devices.
      g_host_kernels.store(false, std::memory_order_release);
    }
    OPENREG_CHECK(probe);
    // Long host waits give way to the user's interrupt (OpenRegInterrupt.h).
    OPENREG_CHECK(orSetHostWaitCheck(&host_wait_check));
    pthread_atfork(nullptr, nullptr, on_fork_child);
    g_initialized.store(true, std::memory_order_release);
  });
}
// [/doc:lazy-init]

// [doc:device-count]
c10::DeviceIndex device_count() noexcept {
  static const c10::DeviceIndex count = [] {
    int n = 0;
    orError_t err = orGetDeviceCount(&n);
    if (err != orSuccess) {
      TORCH_WARN("openreg: no devices available: ",
                 format_error(err, "orGetDeviceCount"));
      return c10::DeviceIndex{0};
    }
    if (n > kMaxDevices) {
      TORCH_WARN("openreg: the driver reports ", n,
                 " devices; this build handles at most ",
                 static_cast<int>(kMaxDevices), ", using the first ",
                 static_cast<int>(kMaxDevices));
      return kMaxDevices;
    }
    return static_cast<c10::DeviceIndex>(n);
  }();
  return count;
}
// [/doc:device-count]

void raise_invalid_device(c10::DeviceIndex device) {
  c10::DeviceIndex count = device_count();
  TORCH_CHECK(false, "Invalid openreg device index ", static_cast<int>(device),
              ": this machine has ", static_cast<int>(count),
              " openreg device(s), valid indices are 0..",
              static_cast<int>(count) - 1,
              " (set OPENREG_DEVICE_COUNT to simulate more)");
}

c10::DeviceIndex current_device() {
  lazy_init();
  int device = 0;
  OPENREG_CHECK(orGetDevice(&device));
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  lazy_init();
  OPENREG_CHECK(orSetDevice(device));
}

c10::DeviceIndex exchange_device(c10::DeviceIndex device) {
  c10::DeviceIndex previous = current_device();
  if (device != previous) {
    set_device(device);
  }
  return previous;
}

c10::DeviceIndex maybe_exchange_device(c10::DeviceIndex device) {
  return exchange_device(device);
}

void unchecked_set_device(c10::DeviceIndex device) noexcept {
  OPENREG_CHECK_WARN(orSetDevice(device));
}

namespace {
std::atomic<int> g_sync_debug_mode{0};
}  // namespace

void set_sync_debug_mode(int mode) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "invalid sync debug mode ", mode,
              ": expected 0 (default), 1 (warn) or 2 (error)");
  g_sync_debug_mode.store(mode);
}

int get_sync_debug_mode() noexcept { return g_sync_debug_mode.load(); }

namespace {
std::atomic<std::string (*)()> g_sync_caller{nullptr};
}  // namespace

void set_sync_caller_hook(std::string (*hook)()) {
  g_sync_caller.store(hook, std::memory_order_release);
}

void warn_or_error_on_sync(const char* what) {
  const int mode = g_sync_debug_mode.load(std::memory_order_relaxed);
  if (C10_LIKELY(mode == 0)) {
    return;
  }
  // What the program called, as the user wrote it ("Tensor.__bool__ at
  // train.py:12: `if loss > 0:`"), when the Python module can tell.
  std::string caller;
  if (std::string(*hook)() = g_sync_caller.load(std::memory_order_acquire)) {
    caller = hook();
  }
  const std::string where = caller.empty() ? "" : " from " + caller;
  if (mode == 2) {
    TORCH_CHECK(false, "called a synchronizing openreg operation (", what, ")",
                where, " with sync debug mode 2 (error)");
  }
  TORCH_WARN("called a synchronizing openreg operation (", what, ")", where);
}

bool launch_blocking() {
  static const bool blocking = [] {
    const char* env = std::getenv("OPENREG_LAUNCH_BLOCKING");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return blocking;
}

}  // namespace openreg
