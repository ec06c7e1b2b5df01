// libopenreg_kernels.so: the device's kernel library (openreg.h, "Named
// kernels"), which a device loads with orModuleLoad and whose functions the
// host launches with orLaunchFunction and bytes of parameters: a port's own
// device code goes here. These are the library's kernels every backend on
// this runtime uses (injected faults, the profiler's timestamps); the
// simulator's engine adds its own (engine/kernels/OpenRegEngineKernels.cpp).
//
// It uses only openreg.h's types: everything it needs from the device comes
// in orKernelContext.
#include <openreg.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

// [doc:crash-kernel]
// A kernel that crashes the device on purpose, for tests of a lost device
// (torch.openreg.faults.crash_device): params is one int32, 1 to write
// through a null pointer (SIGSEGV), 2 to abort (SIGABRT). Only a device in a
// process of its own may run it: in the thread driver it would end the
// user's program, which is what the process driver exists to prevent, so
// the host refuses to launch it there.
extern "C" __attribute__((visibility("default"))) int openreg_fault_crash(
    const void* params, size_t bytes, orKernelContext* ctx) {
  int32_t how = 0;
  if (bytes == sizeof(how)) {
    std::memcpy(&how, params, sizeof(how));
  }
  if (ctx->version >= 2) {
    ctx->describe(ctx, how == 1   ? "a segfault on purpose"
                       : how == 2 ? "an abort on purpose"
                                  : "bad parameters");
  }
  if (how == 1) {
    volatile int* null = nullptr;
    *null = 1;
  } else if (how == 2) {
    std::abort();
  }
  ctx->report_error(ctx,
                    "openreg_fault_crash: params must be one int32, "
                    "1 (segfault) or 2 (abort)");
  return 1;
}
// [/doc:crash-kernel]

// The profiler's device timestamps on a device that runs named kernels only
// (profiler/OpenRegProfilerHooks.cpp): params is one uint64, the address of
// an int64 in pinned host memory, where the kernel stores the device's clock
// (nanoseconds since the epoch of the system clock, the profiler's) when
// the stream reaches it. A real device writes its timer the same way.
extern "C" __attribute__((visibility("default"))) int openreg_profiler_stamp(
    const void* params, size_t bytes, orKernelContext* ctx) {
  uint64_t address = 0;
  if (bytes == sizeof(address)) {
    std::memcpy(&address, params, sizeof(address));
  }
  auto* slot = static_cast<int64_t*>(
      ctx->translate(ctx, reinterpret_cast<const void*>(address)));
  if (slot == nullptr) {
    ctx->report_error(ctx,
                      "openreg_profiler_stamp: params must be the address of "
                      "an int64 in pinned host memory");
    return 1;
  }
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  __atomic_store_n(slot, now, __ATOMIC_RELEASE);
  return 0;
}

// faults::fail_kernel on a device that runs named kernels only: the host
// launches this in place of the kernel that is to fail, with the failure's
// message as params (text, not NUL-terminated), so the failure surfaces in
// stream order at the next synchronization, as on the thread driver.
extern "C" __attribute__((visibility("default"))) int openreg_fault_fail(
    const void* params, size_t bytes, orKernelContext* ctx) {
  const std::string message(static_cast<const char*>(params), bytes);
  ctx->report_error(ctx, message.c_str());
  return 1;
}

// faults.warn_on_device: gives its bytes as a warning of the device.
extern "C" __attribute__((visibility("default"))) int openreg_fault_warn(
    const void* params, size_t bytes, orKernelContext* ctx) {
  const std::string message(static_cast<const char*>(params), bytes);
  if (ctx->version < 3) {
    ctx->report_error(ctx, "openreg_fault_warn: the driver has no warn()");
    return 1;
  }
  ctx->warn(ctx, message.c_str());
  return 0;
}

// faults::delay_kernels on such a device: params is one int64, the
// microseconds the stream stalls before its next kernel.
extern "C" __attribute__((visibility("default"))) int openreg_fault_delay(
    const void* params, size_t bytes, orKernelContext* ctx) {
  int64_t us = -1;
  if (bytes == sizeof(us)) {
    std::memcpy(&us, params, sizeof(us));
  }
  if (us < 0) {
    ctx->report_error(ctx,
                      "openreg_fault_delay: params must be one int64 >= 0");
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  return 0;
}
