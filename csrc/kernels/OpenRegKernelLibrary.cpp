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
#include <cstring>
#include <exception>
#include <string>

#include "kernels/OpenRegBoxedCall.h"
#include "kernels/OpenRegCallFormat.h"

namespace {

void* translate(void* state, const void* device_address) {
  auto* ctx = static_cast<orKernelContext*>(state);
  return ctx->translate(ctx, device_address);
}

// The call's thread count, for its parallel regions on this thread.
class KernelThreads {
 public:
  KernelThreads(const void* params, size_t bytes) {
    openreg::call::CallHeader h{};
    if (bytes < sizeof(h)) {
      return;
    }
    std::memcpy(&h, params, sizeof(h));
    const int max = omp_get_max_threads();
    const int want = h.threads > 0 ? h.threads : max;
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

}  // namespace

// A serialized boxed call (kernels/OpenRegCallFormat.h). What the CPU
// kernel throws becomes the launch's error message.
extern "C" __attribute__((visibility("default"))) int openreg_boxed_call(
    const void* params, size_t bytes, orKernelContext* ctx) {
  try {
    const KernelThreads threads(params, bytes);
    openreg::run_boxed_call(params, bytes, {&translate, ctx});
    return 0;
  } catch (const c10::Error& e) {
    ctx->report_error(ctx, e.what_without_backtrace());
  } catch (const std::exception& e) {
    ctx->report_error(ctx, e.what());
  }
  return 1;
}
