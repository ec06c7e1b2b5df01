#include "core/OpenRegKernelTask.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#include "core/OpenRegFreeList.h"

namespace openreg {

namespace {

thread_local orStream_t t_worker_stream = nullptr;

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

// The task objects a host thread may reuse.
using TaskPool = FreeList<KernelTask>;

TaskPool& task_pool() {
  thread_local TaskPool pool;
  return pool;
}
// [/doc:task-reclaim]

// [doc:host-work-after-event]
// Host work waiting for its event (run_after_event). The count lets every
// launch check for it without the lock.
struct AfterEvent {
  orEvent_t done;
  std::function<void()> work;
};
std::mutex g_after_mutex;
std::vector<AfterEvent> g_after;  // guarded by g_after_mutex
std::atomic<size_t> g_after_count{0};

void run_finished_host_work() {
  if (g_after_count.load(std::memory_order_relaxed) == 0) {
    return;
  }
  std::vector<AfterEvent> ready;
  {
    std::lock_guard<std::mutex> lock(g_after_mutex);
    // In order: the work of one stream completes in the order it was queued.
    const auto first_done = std::stable_partition(
        g_after.begin(), g_after.end(), [](const AfterEvent& a) {
          return orEventQuery(a.done) == orErrorNotReady;
        });
    ready.assign(std::make_move_iterator(first_done),
                 std::make_move_iterator(g_after.end()));
    g_after.erase(first_done, g_after.end());
    g_after_count.store(g_after.size(), std::memory_order_relaxed);
  }
  for (AfterEvent& a : ready) {
    (void)orEventDestroy(a.done);
    a.work();
  }
}
// [/doc:host-work-after-event]

}  // namespace

void run_after_event(orEvent_t done, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(g_after_mutex);
    g_after.push_back({done, std::move(work)});
    g_after_count.store(g_after.size(), std::memory_order_relaxed);
  }
  if (t_worker_stream == nullptr) {
    run_finished_host_work();  // earlier work, or this one if already done
  }
}

KernelTask* take_task() { return task_pool().take(); }

void give_back_unlaunched(KernelTask* task) noexcept {
  task->kernel = nullptr;
  task_pool().give(task);
}

void hand_back(KernelTask* task) noexcept {
  KernelTask* head = g_finished.load(std::memory_order_relaxed);
  do {
    task->next = head;
  } while (!g_finished.compare_exchange_weak(
      head, task, std::memory_order_release, std::memory_order_relaxed));
}

void reclaim_finished_tasks() {
  if (t_worker_stream != nullptr) {
    return;
  }
  run_finished_host_work();
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

WorkerScope::WorkerScope(orStream_t stream) : previous_(t_worker_stream) {
  t_worker_stream = stream;
}

WorkerScope::~WorkerScope() { t_worker_stream = previous_; }

orStream_t worker_stream() { return t_worker_stream; }

}  // namespace openreg
