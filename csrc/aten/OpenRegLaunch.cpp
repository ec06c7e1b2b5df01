// Kernel launch: the execution model of openreg (see OpenRegLaunch.h).
//
// Every stream is an in-order queue drained by a worker thread (the runtime's
// orLaunchKernel). A kernel is a closure that captures what it needs *by
// value*: device tensors as non-owning references to the same memory
// (DeviceTensorRef, borrowed_alias: a tensor freed on the host returns its
// block to the
// caching allocator at once, which reuses it only in stream order, as CUDA's
// does; the worker never touches Python objects), CPU tensors as snapshots.
// If it throws, the message is kept per stream and raised, naming the op, at
// the next synchronization of that stream or its device; the stream stays
// usable.
#include "aten/OpenRegLaunch.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>
#include <omp.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/OpenRegEngine.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegInterrupt.h"
#include "core/OpenRegKernelTask.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegNamedKernels.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"
#include "profiler/OpenRegProfiler.h"

namespace openreg {

namespace {

// [doc:worker-threads]
// SIMULATOR ONLY: how many threads a kernel's parallel regions use on the
// worker, which shares the machine's cores with the host.
//
// The host thread keeps dispatching while the worker runs, so a small
// kernel opening an OpenMP team would take the host's core for a team
// thread that then waits in the team's barrier for the worker, or the
// worker for it, each preempted by the other (a dispatch-bound training
// step ran 1.6x slower that way). Kernels on small tensors, whose work would
// not fill two threads anyway (ATen's parallel_for does not split below
// GRAIN_SIZE elements), run on the worker alone. Larger kernels get the
// intra-op threads of the thread that launched them (at::get_num_threads()
// there, read at the launch: torch.set_num_threads limits the device's
// kernels as it limits CPU ones; the worker's own OpenMP setting would
// ignore it).
//
// The count depends only on that setting and on the sizes of the call's
// tensor arguments, never on whether the call is queued or the first of its
// signature (which runs synchronously), nor on what else runs on the
// machine: some CPU kernels split a reduction into one partial sum per
// thread (layer_norm's backward, the sums of a TensorIterator), so the team
// size decides the bits of the result. (Earlier the team shrank while other
// programs kept the machine busy; a result that changes with the machine's
// load, which the user cannot control, is a wrong result.) What the device
// does with the count is the one place where the program's own timing
// counts: a serialized call runs on one thread fewer while the host runs
// rather than waits for the device (orKernelContext::team_threads), every
// call outside deterministic mode, where PyTorch promises no bitwise
// reproducibility (a GPU's results vary too), and in it only those of an
// operator whose every element rounds alike on any number of threads
// (kTeamSizeFree: add, mul, ...), so that identical calls give identical
// bits, the CPU's for that thread count (doc:fewer-threads in
// aten/fallback/OpenRegOpTraits.cpp).
//
// Only the thread count changes: initialising ATen's threading state on the
// worker from here (at::internal::lazy_init_num_threads) made convolutions
// on the worker twice as slow (conv2d 64 ch 56x56: 0.61 -> 1.29 ms).
//
// The host's half, at the launch: the most threads a kernel whose largest
// tensor argument has `elements` elements (-1: unknown) may use.
int thread_cap(int64_t elements) {
  return elements >= 0 && elements < at::internal::GRAIN_SIZE
             ? 1
             : at::get_num_threads();
}

// The worker's half, around the kernel: exactly `cap` threads.
class WorkerThreads {
 public:
  explicit WorkerThreads(int cap) {
    const int max = omp_get_max_threads();
    const int want = std::max(1, cap);
    if (want != max) {
      previous_ = max;
      omp_set_num_threads(want);
    }
  }
  ~WorkerThreads() {
    if (previous_ > 0) {
      omp_set_num_threads(previous_);
    }
  }
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

 private:
  int previous_ = 0;
};
// [/doc:worker-threads]

// [doc:host-team]
// SIMULATOR ONLY: the launching thread's OpenMP team, released before a
// kernel that may run on a team of the device's.
//
// After a parallel region libgomp keeps a team's threads spinning, so that
// the next region starts at once, only while the process has no more OpenMP
// threads than cores (GOMP_SPINCOUNT in libgomp's manual); past that they
// spin 100 polls and sleep, and every region pays a futex wake-up per
// thread. The worker leads a team of its own (WorkerThreads), and a host
// thread that ran one CPU parallel region (a mean over 131,072 floats will
// do) keeps its team's threads for the next: on 2 cores that is one thread
// too many, and the device's x + x on 65,536 floats took 53 us instead of
// 8.5 (benchmarks/host_omp_team.py). A device has cores of its own, which
// the host's CPU work does not slow. So a launch whose kernel may use a
// team (`threads` > 1) first ends the calling thread's idle team:
// omp_pause_resource_all, which in libgomp frees the calling thread's pool,
// returns at once on a thread that has none, and refuses inside a parallel
// region. The host's next CPU parallel region starts its threads again, and
// they stay until the next such launch: a loop that alternates one CPU
// region with one such kernel pays about 100 us an iteration for it, one
// with ten kernels gains (benchmarks/README.md, stop 54; releasing at most
// once a millisecond was worse for both). Thread driver only: a device
// process has its own OpenMP runtime, and run_sync's staged kernels run on
// the host's own team.
void release_host_team(int threads) {
  if (threads > 1) {
    (void)omp_pause_resource_all(omp_pause_soft);
  }
}
// [/doc:host-team]

// The floating-point mode device kernels run in, set on the calling thread
// while alive: denormals kept (torch.set_flush_denormal sets the calling
// thread's mode; device kernels ignore it, as CUDA's do).
class DeviceFloatMode {
 public:
#if defined(__x86_64__) || defined(_M_X64)
  DeviceFloatMode() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero));
  }
  ~DeviceFloatMode() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 0x8000;
  static constexpr unsigned kDenormalsAreZero = 0x0040;
  unsigned saved_;
#else
  DeviceFloatMode() = default;
#endif
  DeviceFloatMode(const DeviceFloatMode&) = delete;
  DeviceFloatMode& operator=(const DeviceFloatMode&) = delete;
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

// The engine's scope around a host kernel (its workspace for the CPU
// kernels inside, core/OpenRegEngine.h); nothing without an engine.
class HostKernelScope {
 public:
  HostKernelScope()
      : previous_(engine().enter_host_kernel != nullptr &&
                  engine().enter_host_kernel()) {}
  ~HostKernelScope() {
    if (engine().leave_host_kernel != nullptr) {
      engine().leave_host_kernel(previous_);
    }
  }
  HostKernelScope(const HostKernelScope&) = delete;
  HostKernelScope& operator=(const HostKernelScope&) = delete;

 private:
  bool previous_;
};

int run_task(void* data) {
  auto* task = static_cast<KernelTask*>(data);
  int status = 1;
  {
    const WorkerScope on_worker(task->stream);
    const HostKernelScope engine_scope;
    const WorkerThreads threads(task->threads);
    DeferWarnings defer(task->stream);
    const c10::WarningUtils::WarningHandlerGuard guard(&defer);
    if (task->delay_us > 0) {  // faults::delay_kernels
      std::this_thread::sleep_for(std::chrono::microseconds(task->delay_us));
    }
    try {
      if (!task->failure.empty()) {  // faults::fail_kernel
        record_kernel_failure(task->stream, task->op, task->failure.c_str());
      } else {
        task->kernel();
        status = 0;
      }
    } catch (const c10::Error& e) {
      record_kernel_failure(task->stream, task->op, e.what_without_backtrace());
    } catch (const std::exception& e) {
      record_kernel_failure(task->stream, task->op, e.what());
    }
  }
  hand_back(task);
  return status;
}

// A kernel the host waits for (run_sync): it runs on the stream's worker in
// the state of the thread that launched it, and what it throws goes back to
// that thread.
struct SyncCall {
  c10::function_ref<void()> kernel;
  int threads;  // thread_cap() of the call
  at::ThreadLocalState state;
  c10::WarningHandler* warnings;
  std::exception_ptr error;
  orStream_t stream;
  int64_t delay_us = 0;  // faults::delay_kernels
  // Set last: from then on the worker no longer touches this object (or
  // the caller's memory the kernel refers to).
  std::atomic<bool> done{false};
};

int run_sync_call(void* data) {
  auto* call = static_cast<SyncCall*>(data);
  {
    const WorkerScope on_worker(call->stream);
    const HostKernelScope engine_scope;
    const WorkerThreads threads(call->threads);
    const at::ThreadLocalStateGuard state(call->state);
    const c10::WarningUtils::WarningHandlerGuard warnings(call->warnings);
    if (call->delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(call->delay_us));
    }
    try {
      call->kernel();
    } catch (...) {
      call->error = std::current_exception();
    }
  }
  call->done.store(true, std::memory_order_release);
  return 0;
}

// A synchronous kernel refers to its caller's memory (the call above, what
// the kernel's closure captures): its caller may not return before it has
// finished, even when the wait itself ended (the watchdog lost the device
// around a kernel that the thread driver cannot stop).
void wait_until_done(const SyncCall& call, const char* op) {
  if (call.done.load(std::memory_order_acquire)) {
    return;
  }
  std::fprintf(stderr,
               "openreg: the device was lost while its synchronous kernel "
               "'%s' runs on a thread of this process, which the thread "
               "driver cannot stop; waiting for it to return, since it uses "
               "this thread's memory (OPENREG_DRIVER=process ends a hung "
               "device for good)\n",
               op != nullptr ? op : "(unnamed)");
  while (!call.done.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

// [doc:run-sync]
void run_sync(c10::DeviceIndex device, c10::function_ref<void()> kernel,
              int64_t elements, const char* op) {
  if (worker_stream() != nullptr) {
    // Already on a worker, in stream order: waiting for the stream here
    // would wait for this very call.
    kernel();
    return;
  }
  faults::check_not_poisoned(device);
  OpenRegStream stream = getCurrentStream(device);
  // Both waits of a synchronous kernel are openreg's own, not the
  // program's (the sanitizer is not told of them).
  const InternalWait internal;
  {
    // Nothing of this kernel is queued yet: Ctrl-C may end this wait (not
    // the one below, which keeps `call` on this stack in use).
    const InterruptibleWait interruptible;
    stream.synchronize();
  }
  if (op != nullptr) {
    if (std::optional<std::string> failure = faults::kernel_fails(device, op)) {
      // The host waits for this kernel: its failure is raised now.
      faults::surfaced(device, "the call (it runs synchronously)");
      throw c10::AcceleratorError({__func__, __FILE__, __LINE__},
                                  orErrorLaunchFailure,
                                  "openreg kernel '" + std::string(op) +
                                      "' failed on the device: " + *failure);
    }
  }
  if (!host_kernels_supported()) {
    // The device runs named kernels only (OPENREG_DRIVER=process): the
    // kernel runs here, on the calling thread, over tensors staged through
    // host memory (the engine's run_staged, core/OpenRegEngine.h), as a real
    // device's CPU fallback does.
    // As on a worker: the call's own thread count (identical calls, queued
    // or not, split their reductions alike) and the device's floating-point
    // mode, not the host thread's (torch.set_flush_denormal).
    const profiler::InlineKernel trace(device);
    const WorkerThreads threads(thread_cap(elements));
    const DeviceFloatMode float_mode;
    if (engine().run_staged != nullptr) {
      engine().run_staged(kernel);  // the engine stages what its views touch
    } else {
      kernel();  // no engine: no host code reads device memory
    }
    return;
  }
  const profiler::InlineKernel trace(device);
  const int threads = thread_cap(elements);
  release_host_team(threads);
  SyncCall call{kernel,
                threads,
                at::ThreadLocalState(),
                c10::WarningUtils::get_warning_handler(),
                nullptr,
                stream.native(),
                faults::kernel_delay_us(device, stream.id())};
  orLaunchAttributes attrs{};
  attrs.hostThreads = call.threads;
  attrs.name = op;
  OPENREG_CHECK(
      orLaunchKernelEx(stream.native(), &run_sync_call, &call, &attrs));
  try {
    const CallsOwnWait own;
    stream.synchronize();
  } catch (...) {
    wait_until_done(call, op);
    throw;
  }
  if (call.error) {
    std::rethrow_exception(call.error);
  }
}
// [/doc:run-sync]

int kernel_thread_cap(int64_t elements) { return thread_cap(elements); }

// [doc:launch-async]
void launch_async(c10::DeviceIndex device, const std::string& op,
                  KernelBody kernel, int64_t elements) {
  if (!host_kernels_supported()) {
    // Not a named kernel yet: it runs staged, synchronously (run_sync).
    stats::count_op(stats::kStaged, op.c_str());
    run_sync(device, kernel, elements, op.c_str());
    return;
  }
  OpenRegStream stream = getCurrentStream(device);
  if (launch_blocking()) {
    run_sync(device, kernel, elements, op.c_str());
    return;
  }
  faults::check_not_poisoned(device);
  reclaim_finished_tasks();
  const profiler::QueuedKernel trace(stream.unwrap(), op, kernel);
  KernelTask* task = take_task();
  task->kernel = std::move(kernel);
  task->op.assign(op);  // reuses the pooled task's buffer
  task->stream = stream.native();
  task->threads = thread_cap(elements);
  release_host_team(task->threads);
  task->delay_us = faults::kernel_delay_us(device, stream.id());
  if (std::optional<std::string> failure = faults::kernel_fails(device, op)) {
    task->failure = std::move(*failure);
  } else if (!task->failure.empty()) {
    task->failure.clear();  // a pooled task's earlier failure
  }
  // The runtime keeps a worker that never runs a kernel on more threads
  // than itself, and retires one that might, when idle (openreg.h).
  orLaunchAttributes attrs{};
  attrs.hostThreads = task->threads;
  attrs.name = task->op.c_str();  // the task keeps it until reclaimed
  stats::count(stats::kLaunches);
  orError_t err = orLaunchKernelEx(task->stream, &run_task, task, &attrs);
  if (err != orSuccess) {
    give_back_unlaunched(task);
    OPENREG_CHECK(err);
  }
}

// [/doc:launch-async]

// [doc:launch-function]
void launch_function(c10::DeviceIndex device, const std::string& op,
                     orFunction_t function, const void* params, size_t bytes,
                     int64_t elements) {
  faults::check_not_poisoned(device);
  OpenRegStream stream = getCurrentStream(device);
  reclaim_finished_tasks();
  orLaunchAttributes attrs{};
  attrs.hostThreads = thread_cap(elements);
  if (host_kernels_supported()) {
    release_host_team(attrs.hostThreads);
  }
  stats::count(stats::kLaunches);
  // Injected faults travel as kernels of their own, in stream order: a
  // stall before the kernel, a failing kernel in its place (faults.py).
  const int64_t delay_us = faults::kernel_delay_us(device, stream.id());
  if (delay_us > 0) {
    OPENREG_CHECK(orLaunchFunction(stream.native(),
                                   named_kernel(NamedKernel::kDelay), &delay_us,
                                   sizeof(delay_us), nullptr));
  }
  std::string failure_message;
  if (std::optional<std::string> failure = faults::kernel_fails(device, op)) {
    failure_message =
        "openreg kernel '" + op + "' failed on the device: " + *failure;
    function = named_kernel(NamedKernel::kFail);
    params = failure_message.data();
    bytes = failure_message.size();
  }
  const profiler::QueuedFunction trace(stream.unwrap(), op);
  OPENREG_CHECK(
      orLaunchFunction(stream.native(), function, params, bytes, &attrs));
  if (launch_blocking()) {
    if (!failure_message.empty()) {
      faults::surfaced(device, "the call (it runs synchronously)");
    }
    // Raises the kernel's failure now, naming it. The parameters were
    // copied at the launch: Ctrl-C may end the wait. Not the program's
    // synchronization (the sanitizer is not told of it).
    const InterruptibleWait interruptible;
    const InternalWait internal;
    stream.synchronize();
  }
}
// [/doc:launch-function]

}  // namespace openreg
