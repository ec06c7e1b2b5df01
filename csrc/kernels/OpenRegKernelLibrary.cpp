// libopenreg_kernels.so: the PyTorch layer's kernels as a kernel library
// (openreg.h, "Named kernels"), for a device that runs them from bytes: the
// process driver's device process loads it with orModuleLoad and launches
// its functions with orLaunchFunction.
//
// It links ATen's CPU kernels, never the openreg runtime nor Python:
// everything it needs from the device comes in orKernelContext.
#include <c10/util/Exception.h>
#include <omp.h>
#include <openreg.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "kernels/OpenRegBoxedCall.h"
#include "kernels/OpenRegCallFormat.h"
#include "kernels/OpenRegDropout.h"

namespace {

void* translate(void* state, const void* device_address) {
  auto* ctx = static_cast<orKernelContext*>(state);
  return ctx->translate(ctx, device_address);
}

// Where this kernel reaches the device address `address`; throws when it is
// not device memory.
void* device_ptr(orKernelContext* ctx, uint64_t address) {
  void* p = ctx->translate(ctx, reinterpret_cast<const void*>(address));
  TORCH_CHECK(p != nullptr, "address 0x", std::hex, address,
              " is not device memory of device ", ctx->device);
  return p;
}

// A kernel's thread count (0: any), for its parallel regions on this
// thread, for the scope of the object.
class KernelThreads {
 public:
  explicit KernelThreads(int threads) {
    const int max = omp_get_max_threads();
    const int want = threads > 0 ? threads : max;
    if (want != max) {
      previous_ = max;
      omp_set_num_threads(want);
    }
  }
  ~KernelThreads() {
    if (previous_ > 0) {
      omp_set_num_threads(previous_);
    }
  }
  KernelThreads(const KernelThreads&) = delete;
  KernelThreads& operator=(const KernelThreads&) = delete;

 private:
  int previous_ = 0;
};

// The thread count a serialized call carries.
int call_threads(const void* params, size_t bytes) {
  openreg::call::CallHeader h{};
  if (bytes < sizeof(h)) {
    return 0;
  }
  std::memcpy(&h, params, sizeof(h));
  return h.threads;
}

// The parameters of a fixed-layout kernel, or false (after report_error).
template <typename P>
bool read_params(const void* params, size_t bytes, orKernelContext* ctx,
                 const char* kernel, P* out) {
  if (bytes != sizeof(P)) {
    const std::string message =
        std::string(kernel) + ": expected " + std::to_string(sizeof(P)) +
        " parameter bytes, got " + std::to_string(bytes);
    ctx->report_error(ctx, message.c_str());
    return false;
  }
  std::memcpy(out, params, sizeof(P));
  return true;
}

// What a kernel throws becomes its launch's error, naming the operator.
template <typename F>
int run_reporting(orKernelContext* ctx, const std::string& op, F&& f) {
  std::string what;
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  }
  const std::string message =
      "openreg kernel '" + op + "' failed on the device: " + what;
  ctx->report_error(ctx, message.c_str());
  return 1;
}

}  // namespace

// A serialized boxed call (kernels/OpenRegCallFormat.h). What the CPU
// kernel throws becomes the launch's error message, naming the operator as
// the host's deferred errors do.
extern "C" __attribute__((visibility("default"))) int openreg_boxed_call(
    const void* params, size_t bytes, orKernelContext* ctx) {
  // The operator, for a lost device's message and a failure's.
  const std::string op = openreg::boxed_call_name(params, bytes);
  if (ctx->version >= 2) {
    ctx->describe(ctx, op.c_str());
  }
  return run_reporting(ctx, op, [&] {
    const KernelThreads threads(call_threads(params, bytes));
    openreg::run_boxed_call(params, bytes, {&translate, ctx});
  });
}

// openreg's fused dropout (kernels/OpenRegDropout.h), forward and backward:
// the same functions the thread driver's workers run.
extern "C" __attribute__((visibility("default"))) int openreg_dropout(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::kernels::DropoutParams p;
  if (!read_params(params, bytes, ctx, "openreg_dropout", &p)) {
    return 1;
  }
  return run_reporting(ctx, "aten::native_dropout", [&] {
    const KernelThreads threads(p.threads);
    openreg::kernels::dropout(device_ptr(ctx, p.in), device_ptr(ctx, p.out),
                              static_cast<bool*>(device_ptr(ctx, p.mask)), p.n,
                              static_cast<c10::ScalarType>(p.dtype),
                              p.threshold, p.scale, p.seed, p.offset);
  });
}

extern "C" __attribute__((visibility("default"))) int openreg_dropout_backward(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::kernels::DropoutBackwardParams p;
  if (!read_params(params, bytes, ctx, "openreg_dropout_backward", &p)) {
    return 1;
  }
  return run_reporting(ctx, "aten::native_dropout_backward", [&] {
    const KernelThreads threads(p.threads);
    openreg::kernels::dropout_backward(
        device_ptr(ctx, p.grad),
        static_cast<const bool*>(device_ptr(ctx, p.mask)),
        device_ptr(ctx, p.out), p.n, static_cast<c10::ScalarType>(p.dtype),
        p.scale);
  });
}

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
