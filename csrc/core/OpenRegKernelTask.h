// The tasks the PyTorch layer's launches hand to the stream workers
// (orLaunchKernelEx), and how they come back to the host.
//
// A launch (aten/OpenRegLaunch.h) takes a task from the host thread's pool,
// puts the kernel's closure in it and launches it; the worker runs it and
// hands it back; the host destroys the closures of the tasks that came back
// at its next launch or synchronization (core/OpenRegSynchronize.h calls
// reclaim_finished_tasks) and keeps the task objects for reuse.
//
// Thread-safety: take_task() and reclaim_finished_tasks() are for host
// threads (each has its own pool); hand_back() for the workers.
#pragma once

#include <openreg.h>

#include <functional>
#include <string>

#include "core/OpenRegKernelBody.h"

namespace openreg {

struct KernelTask {
  KernelBody kernel;
  std::string op;  // names the kernel in deferred errors and the profiler
  orStream_t stream = nullptr;
  int threads = 0;  // most threads its parallel regions may use
  // Faults on demand (core/OpenRegFaults.h): how long the kernel starts
  // late, and the failure it reports instead of running ("" : none).
  int64_t delay_us = 0;
  std::string failure;
  KernelTask* next = nullptr;  // in the finished list or a free list
};

// A task object for a launch on the calling host thread.
KernelTask* take_task();
// Returns a task that was never launched (its launch failed) to the pool.
void give_back_unlaunched(KernelTask* task) noexcept;
// On the worker, once the task's kernel has run.
void hand_back(KernelTask* task) noexcept;
// Destroys, on the calling host thread, the closures of the tasks that have
// run, and runs the host work whose event has completed (run_after_event).
// Cheap when there is nothing to reclaim; does nothing on a worker.
void reclaim_finished_tasks();

// Host work in stream order on a driver that runs no host code on its
// streams (each device a process of its own, OPENREG_DRIVER=process):
// `work` runs on a host thread once `done`, an event recorded on the stream
// the work follows, has completed (or its device is lost). The next launch
// or synchronization of this process that finds it complete runs it
// (reclaim_finished_tasks), as CUDA's caching allocator reuses a block freed
// on another stream once its events have completed. Takes over `done` and
// destroys it. `work` must not throw.
void run_after_event(orEvent_t done, std::function<void()> work);

// While alive, the calling thread is the worker of `stream` running a kernel
// (a queued task, or a synchronous call of run_sync).
class WorkerScope {
 public:
  explicit WorkerScope(orStream_t stream);
  ~WorkerScope();
  WorkerScope(const WorkerScope&) = delete;
  WorkerScope& operator=(const WorkerScope&) = delete;

 private:
  orStream_t previous_;
};

// The stream whose kernel the calling thread runs now, or nullptr on a host
// thread. Waiting for that stream from its own kernel would wait for the
// kernel itself: the synchronization functions skip it.
orStream_t worker_stream();

}  // namespace openreg
