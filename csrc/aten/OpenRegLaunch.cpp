// Kernel launch: the execution model of openreg (see OpenRegLaunch.h).
//
// Every stream is an in-order queue drained by a worker thread (the runtime's
// orLaunchKernel). A kernel is a closure that captures what it needs *by
// value*: device tensors as non-owning handles over the same memory
// (borrowed_alias: a tensor freed on the host returns its block to the
// caching allocator at once, which reuses it only in stream order, as CUDA's
// does; the worker never touches Python objects), CPU tensors as snapshots.
// If it throws, the message is kept per stream and raised, naming the op, at
// the next synchronization of that stream or its device; the stream stays
// usable.
#include "aten/OpenRegLaunch.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/OpenRegException.h"
#include "core/OpenRegSynchronize.h"

namespace openreg {

namespace {

struct KernelTask {
  std::function<void()> kernel;
  std::string op;
  orStream_t stream;
};

// Keeps the warnings a kernel raises on the worker for the next
// synchronization, where the host raises them.
class DeferWarnings : public c10::WarningHandler {
 public:
  explicit DeferWarnings(orStream_t stream) : stream_(stream) {}
  void process(const c10::Warning& warning) override {
    record_kernel_warning(stream_, warning);
  }

 private:
  orStream_t stream_;
};

int run_task(void* data) {
  std::unique_ptr<KernelTask> task(static_cast<KernelTask*>(data));
  DeferWarnings defer(task->stream);
  const c10::WarningUtils::WarningHandlerGuard guard(&defer);
  try {
    task->kernel();
    return 0;
  } catch (const c10::Error& e) {
    record_kernel_failure(task->stream, task->op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    record_kernel_failure(task->stream, task->op, e.what());
  }
  return 1;
}

}  // namespace

bool launch_blocking() {
  static const bool blocking = [] {
    const char* env = std::getenv("OPENREG_LAUNCH_BLOCKING");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return blocking;
}

// [doc:launch-async]
void launch_async(c10::DeviceIndex device, std::string op,
                  std::function<void()> kernel) {
  OpenRegStream stream = getCurrentStream(device);
  if (launch_blocking()) {
    stream.synchronize();
    const profiler::InlineKernel trace(device);
    kernel();
    return;
  }
  const profiler::QueuedKernel trace(stream.unwrap(), op, kernel);
  auto* task =
      new KernelTask{std::move(kernel), std::move(op), stream.native()};
  orError_t err = orLaunchKernel(task->stream, &run_task, task);
  if (err != orSuccess) {
    delete task;
    OPENREG_CHECK(err);
  }
}
// [/doc:launch-async]

}  // namespace openreg
