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
#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>

#include "aten/OpenRegFreeList.h"
#include "core/OpenRegException.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"
#include "memory/OpenRegKernelScratch.h"
#include "profiler/OpenRegProfiler.h"

namespace openreg {

namespace {

// True on a stream's worker while it runs a kernel of this file.
thread_local bool t_on_worker = false;

struct OnWorker {
  OnWorker() { t_on_worker = true; }
  ~OnWorker() { t_on_worker = false; }
  OnWorker(const OnWorker&) = delete;
  OnWorker& operator=(const OnWorker&) = delete;
};

struct KernelTask {
  KernelBody kernel;
  std::string op;
  orStream_t stream = nullptr;
  int threads = 0;  // most threads its parallel regions may use (see below)
  KernelTask* next = nullptr;  // in the finished list or a free list
};

// [doc:task-reclaim]
// Where a launch's state is freed. The host makes a kernel's closure (its
// captures, their vectors, the tensors it borrows) and the worker runs it; if
// the worker also freed it, every launch would free on one thread what the
// other allocated, and the C library's allocator would hand that memory back to
// the allocating thread's arena under a lock both threads then take for every
// allocation (the tiny-op loop spent a fifth of its time in that lock). So the
// worker only runs a task and hands it back on `g_finished`; the next launch
// (or synchronization) on the host takes the whole list, destroys the closures
// there and keeps the task objects for reuse. Captures therefore live until the
// host's next launch or synchronization after the kernel ran: none of them owns
// device memory (kernels borrow it, see borrowed_alias), so no block stays
// allocated.
std::atomic<KernelTask*> g_finished{nullptr};

void hand_back(KernelTask* task) {
  KernelTask* head = g_finished.load(std::memory_order_relaxed);
  do {
    task->next = head;
  } while (!g_finished.compare_exchange_weak(
      head, task, std::memory_order_release, std::memory_order_relaxed));
}

// The task objects a host thread may reuse.
using TaskPool = FreeList<KernelTask>;

TaskPool& task_pool() {
  thread_local TaskPool pool;
  return pool;
}
// [/doc:task-reclaim]

// [doc:worker-threads]
// SIMULATOR ONLY: how many threads a kernel's parallel regions use on the
// worker, which shares the machine's cores with the host and with every
// other program.
//
// The host thread keeps dispatching while the worker runs, so a small
// kernel opening an OpenMP team would take the host's core for a team
// thread that then waits in the team's barrier for the worker, or the
// worker for it, each preempted by the other (a dispatch-bound training
// step ran 1.6x slower that way). Kernels on small tensors, whose work would
// not fill two threads anyway (ATen's parallel_for does not split below
// GRAIN_SIZE elements), run on the worker alone.
//
// Larger kernels get the intra-op threads of the thread that launched them
// (at::get_num_threads() there, read at the launch: torch.set_num_threads
// limits the device's kernels as it limits CPU ones; the worker's own
// OpenMP setting would ignore it), less one for each thread that other
// programs keep runnable beyond what openreg itself may have running (the
// worker, its team, the host): on a machine whose cores
// are all taken, a team waits at every barrier for a member the scheduler
// has preempted, and runs slower than the worker alone (an MLP step with
// two spinning processes beside it: 7.8 ms with teams, 2.7 ms without).
// The count of runnable threads is the kernel's own (/proc/loadavg), read
// at most once a millisecond.
//
// Only the thread count changes: initialising ATen's threading state on the
// worker from here (at::internal::lazy_init_num_threads) made convolutions
// on the worker twice as slow (conv2d 64 ch 56x56: 0.61 -> 1.29 ms).
//
// The host's half, at the launch: the most threads a kernel on tensors of
// `elements` (-1: unknown) may use.
int thread_cap(int64_t elements) {
  return elements >= 0 && elements < at::internal::GRAIN_SIZE
             ? 1
             : at::get_num_threads();
}

// The worker's half, around the kernel: at most `cap` threads, fewer on a
// busy machine.
class WorkerThreads {
 public:
  explicit WorkerThreads(int cap) {
    const int max = omp_get_max_threads();
    const int limit = std::min(max, cap);
    const int want = limit <= 1 ? 1 : threads_left_by_others(limit);
    if (want < max) {
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
  // Threads runnable on the whole machine now, or -1 if unknown.
  static int runnable_threads() {
    static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return -1;
    }
    char buf[128];
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0) {
      return -1;
    }
    buf[n] = '\0';
    // "0.50 0.40 0.30 3/120 4567": the fourth field's numerator.
    const char* p = buf;
    for (int field = 0; field < 3 && p != nullptr; ++field) {
      p = std::strchr(p, ' ');
      p = p != nullptr ? p + 1 : nullptr;
    }
    return p != nullptr ? std::atoi(p) : -1;
  }

  // `max` less the threads other programs keep runnable (see above).
  static int threads_left_by_others(int max) {
    using Clock = std::chrono::steady_clock;
    thread_local Clock::time_point checked;
    thread_local int others = -1;
    thread_local int team = 0;  // the count this worker last gave
    const Clock::time_point now = Clock::now();
    if (others < 0 || now - checked > std::chrono::milliseconds(1)) {
      checked = now;
      const int runnable = runnable_threads();
      // Ours at most: this worker, the team it last had, the host thread.
      const int ours = (team > 0 ? team : max) + 1;
      others = runnable < 0 ? 0 : std::max(0, runnable - ours);
    }
    team = std::max(1, max - others);
    return team;
  }

  int previous_ = 0;
};
// [/doc:worker-threads]

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
  auto* task = static_cast<KernelTask*>(data);
  int status = 1;
  {
    const OnWorker on_worker;
    const KernelScratchScope scratch;
    const WorkerThreads threads(task->threads);
    DeferWarnings defer(task->stream);
    const c10::WarningUtils::WarningHandlerGuard guard(&defer);
    try {
      task->kernel();
      status = 0;
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
};

int run_sync_call(void* data) {
  auto* call = static_cast<SyncCall*>(data);
  const OnWorker on_worker;
  const KernelScratchScope scratch;
  const WorkerThreads threads(call->threads);
  const at::ThreadLocalStateGuard state(call->state);
  const c10::WarningUtils::WarningHandlerGuard warnings(call->warnings);
  try {
    call->kernel();
  } catch (...) {
    call->error = std::current_exception();
  }
  return 0;
}

}  // namespace

// [doc:run-sync]
void run_sync(c10::DeviceIndex device, c10::function_ref<void()> kernel) {
  if (t_on_worker) {
    // Already on a worker, in stream order: waiting for the stream here
    // would wait for this very call.
    kernel();
    return;
  }
  OpenRegStream stream = getCurrentStream(device);
  stream.synchronize();
  const profiler::InlineKernel trace(device);
  SyncCall call{kernel, thread_cap(-1), at::ThreadLocalState(),
                c10::WarningUtils::get_warning_handler(), nullptr};
  orLaunchAttributes attrs{};
  attrs.hostThreads = call.threads;
  OPENREG_CHECK(
      orLaunchKernelEx(stream.native(), &run_sync_call, &call, &attrs));
  stream.synchronize();
  if (call.error) {
    std::rethrow_exception(call.error);
  }
}
// [/doc:run-sync]

bool launch_blocking() {
  static const bool blocking = [] {
    const char* env = std::getenv("OPENREG_LAUNCH_BLOCKING");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return blocking;
}

// [doc:launch-async]
void launch_async(c10::DeviceIndex device, const std::string& op,
                  KernelBody kernel, int64_t elements) {
  OpenRegStream stream = getCurrentStream(device);
  if (launch_blocking()) {
    run_sync(device, kernel);
    return;
  }
  reclaim_finished_tasks();
  const profiler::QueuedKernel trace(stream.unwrap(), op, kernel);
  KernelTask* task = task_pool().take();
  task->kernel = std::move(kernel);
  task->op.assign(op);  // reuses the pooled task's buffer
  task->stream = stream.native();
  task->threads = thread_cap(elements);
  // The runtime keeps a worker that never runs a kernel on more threads
  // than itself, and retires one that might, when idle (openreg.h).
  orLaunchAttributes attrs{};
  attrs.hostThreads = task->threads;
  orError_t err = orLaunchKernelEx(task->stream, &run_task, task, &attrs);
  if (err != orSuccess) {
    task->kernel = nullptr;
    task_pool().give(task);
    OPENREG_CHECK(err);
  }
}

void reclaim_finished_tasks() {
  if (g_finished.load(std::memory_order_relaxed) == nullptr) {
    return;
  }
  KernelTask* list = g_finished.exchange(nullptr, std::memory_order_acquire);
  TaskPool& pool = task_pool();
  while (list != nullptr) {
    KernelTask* task = std::exchange(list, list->next);
    task->kernel = nullptr;  // the captures go here, on the host
    pool.give(task);
  }
}
// [/doc:launch-async]

}  // namespace openreg
