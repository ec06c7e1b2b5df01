// Streams: in-order queues, each drained by one worker thread.
#include <pthread.h>

#include <cfenv>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "device_team.h"
#include "runtime_internal.h"

using openreg_rt::Device;

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

orStream::orStream(Device* dev, int priority, bool is_default)
    : dev_(dev),
      priority_(priority),
      is_default_(is_default),
      ring_(new Slot[kCapacity]) {
  for (uint64_t i = 0; i < kCapacity; ++i) {
    ring_[i].seq.store(i, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(dev_->streams_mutex);
  dev_->streams.insert(this);
}

orStream::~orStream() {
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) {
    worker_.join();
  }
}

orError_t orStream::enqueue(std::function<void()> task) {
  Task t;
  t.fn = std::move(task);
  return push(std::move(t));
}

orError_t orStream::enqueue_kernel(orKernelFn fn, void* user_data,
                                   int host_threads, const char* name) {
  Task t;
  t.kernel = fn;
  t.user_data = user_data;
  t.host_threads = host_threads != 1;
  t.name = name;
  return push(std::move(t));
}

orError_t orStream::enqueue_function(orFunction_t fn, const void* params,
                                     size_t bytes, int host_threads) {
  uint64_t ticket = 0;
  Slot* claimed = claim(&ticket);
  if (claimed == nullptr) {
    return orErrorDeviceLost;
  }
  Slot& slot = *claimed;
  Task& t = slot.task;
  t.function = fn;
  t.bytes = bytes;
  t.host_threads = host_threads != 1;
  if (bytes > t.params_capacity) {
    // Rounded up so that launches of similar sizes reuse the buffer.
    const size_t capacity = (bytes + 255) & ~size_t{255};
    t.params.reset(new char[capacity]);
    t.params_capacity = capacity;
  }
  if (bytes != 0) {
    std::memcpy(t.params.get(), params, bytes);
  }
  publish(slot, ticket);
  return orSuccess;
}

orError_t orStream::enqueue_marker(std::function<void()> signal) {
  Task t;
  t.fn = std::move(signal);
  t.marker = true;
  return push(std::move(t));
}

// [doc:stream-push]
// A launch: claim a ticket, fill its slot, publish it, make sure a worker
// will see it. No lock unless the worker sleeps or must be started.
orError_t orStream::push(Task task) {
  uint64_t ticket = 0;
  Slot* claimed = claim(&ticket);
  if (claimed == nullptr) {
    return orErrorDeviceLost;
  }
  Slot& slot = *claimed;
  // The slot's parameter buffer stays with the slot.
  std::unique_ptr<char[]> params = std::move(slot.task.params);
  const size_t capacity = slot.task.params_capacity;
  slot.task = std::move(task);
  slot.task.params = std::move(params);
  slot.task.params_capacity = capacity;
  publish(slot, ticket);
  return orSuccess;
}

orStream::Slot* orStream::claim(uint64_t* ticket) {
  *ticket = tail_.fetch_add(1, std::memory_order_acq_rel);
  Slot& slot = ring_[*ticket % kCapacity];
  while (slot.seq.load(std::memory_order_acquire) != *ticket) {
    // The ring is full: the worker frees this slot when it has run the task
    // one lap back, which has finished once the count passes it. The
    // launcher waits until a quarter of the ring has drained, not just its
    // slot: a host far ahead of the device then wakes once per kRefill
    // tasks rather than at every task the worker finishes (each wake takes
    // a core from the kernel running then, a stall for an OpenMP team).
    // The wait ends early only when the device is lost (a worker that will
    // never free the slot: the watchdog); the launch then fails, and the
    // lost device never runs the ticket.
    if (wait_completed(*ticket + 1 - kCapacity + kRefill, false) != orSuccess) {
      return nullptr;
    }
  }
  return &slot;
}

void orStream::publish(Slot& slot, uint64_t ticket) {
  slot.seq.store(ticket + 1, std::memory_order_release);
  wake_worker();
}
// [/doc:stream-push]

void orStream::wake_worker() {
  // Pairs with the fence in run() before the worker's last look at the
  // ring: either it sees this slot, or this thread sees it asleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (worker_state_.load(std::memory_order_relaxed) == kRunning) {
    return;
  }
  std::lock_guard<std::mutex> lock(worker_mu_);
  switch (worker_state_.load(std::memory_order_relaxed)) {
    case kSleeping:
      work_cv_.notify_one();
      break;
    case kNoWorker:
      if (worker_.joinable()) {
        worker_.join();  // it retired when idle and holds no lock
      }
      worker_state_.store(kRunning, std::memory_order_relaxed);
      worker_ = std::thread([this] { run(); });
      break;
    default:
      break;
  }
}

bool orStream::idle() {
  if (proc_ring_ >= 0) {
    return openreg_rt::proc::stream_idle(this);
  }
  // Under mu_: a marker's signal and its count happen in one step.
  std::lock_guard<std::mutex> lock(mu_);
  return completed_.load(std::memory_order_acquire) ==
         tail_.load(std::memory_order_acquire);
}

// [doc:stream-wait]
// A waiting thread spins briefly when the work it waits for is the last
// task (a run_sync of one kernel: waking a sleeping thread costs more than
// the kernel often does), then sleeps until the worker's count reaches its
// target. The worker wakes it then, not at every task it finishes.
orError_t orStream::wait_completed(uint64_t target, bool interruptible) {
  constexpr auto kSpin = std::chrono::microseconds(20);
  if (completed_.load(std::memory_order_acquire) >= target) {
    return orSuccess;
  }
  const openreg_rt::HostWaiting waiting;
  if (target - completed_.load(std::memory_order_acquire) <= 1) {
    const auto until = Clock::now() + kSpin;
    int n = 0;
    while (completed_.load(std::memory_order_acquire) < target) {
      openreg_rt::cpu_relax();
      if ((++n & 63) == 0 && Clock::now() > until) {
        break;
      }
    }
  }
  std::unique_lock<std::mutex> lock(wait_mu_);
  const auto mine = waiters_.insert(target);
  wake_at_.store(*waiters_.begin(), std::memory_order_seq_cst);
  const auto reached = [&] {
    return completed_.load(std::memory_order_seq_cst) >= target;
  };
  // In slices: a wait that lasts looks at the host wait check, the watchdog
  // and a lost device between them (LongWait), without the lock, which the
  // worker takes to wake waiters.
  openreg_rt::LongWait long_wait(dev_, interruptible);
  orError_t err = orSuccess;
  while (!wait_cv_.wait_for(lock, openreg_rt::kWaitSlice, reached)) {
    lock.unlock();
    err = long_wait.tick();
    lock.lock();
    if (err != orSuccess && !reached()) {
      break;
    }
    err = orSuccess;
  }
  waiters_.erase(mine);
  wake_at_.store(waiters_.empty() ? UINT64_MAX : *waiters_.begin(),
                 std::memory_order_seq_cst);
  return err;
}

void orStream::notify_waiters(uint64_t completed) {
  // Pairs with the waiter's store of wake_at_ before its last look at the
  // count (both sequentially consistent): one of the two sees the other.
  if (completed >= wake_at_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(wait_mu_);
    wait_cv_.notify_all();
  }
}
// [/doc:stream-wait]

orError_t orStream::synchronize(bool interruptible) {
  if (proc_ring_ >= 0) {
    OR_RETURN_IF_ERROR(
        openreg_rt::proc::stream_synchronize(this, interruptible));
  } else {
    const orError_t err =
        wait_completed(tail_.load(std::memory_order_acquire), interruptible);
    if (err == orErrorInterrupted) {
      return err;  // nothing reported or cleared
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  orError_t err = error_;
  error_ = orSuccess;
  reported_message_ = std::move(error_message_);
  error_message_.clear();
  return err != orSuccess ? err : openreg_rt::check_not_lost(dev_);
}

void orStream::record_error(orError_t err, const char* message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_ == orSuccess) {
    error_ = err;
    error_message_ = message != nullptr ? message : "";
  }
}

void orStream::note_running(std::string label) {
  std::lock_guard<std::mutex> lock(running_mu_);
  running_ = std::move(label);
}

std::string orStream::running() {
  std::lock_guard<std::mutex> lock(running_mu_);
  return running_;
}

std::string orStream::last_error_message() {
  std::lock_guard<std::mutex> lock(mu_);
  return reported_message_;
}

// [doc:stream-worker]
// The worker: runs the stream's tasks in order. Idle, it spins for up to
// kSpin, yielding its core, then sleeps until the next launch. Launches come
// in bursts with host work between them, and waking a sleeping worker costs
// the launcher a system call and the device the thread's wake-up. The spin
// outlasts the gaps of a training step's host side (the optimizer grouping
// its tensors, backward's handoff to the autograd thread: 50-300 us): with
// 50 us the worker of bench.py's dispatch-bound step slept and was woken
// about once per step (4477 context switches in 2 s, 3.2 futex calls per
// step on the host); with 300 us, 68 in 2 s, and the step took 402 us
// instead of 440-446.
//
// SIMULATOR ONLY: a worker that may hold host threads retires instead after
// kIdleRetire without work, and the next launch starts a new one. The CPU
// kernels a worker runs may give it a thread pool of its own (OpenMP's),
// and while that pool exists beside the main thread's, OpenMP sees more
// threads than cores and makes every thread of every pool sleep at once
// after each parallel region, which slows the host's own CPU work several
// times over; the pool ends with its thread. A worker that has run only
// kernels launched with hostThreads == 1 owns no pool, and keeps sleeping
// (a stream used once a step would start a thread at every step).
void orStream::run() {
  constexpr auto kSpin = std::chrono::microseconds(300);
  constexpr auto kIdleRetire = std::chrono::milliseconds(10);
  // Kernels run with the stream's device current, as they would on hardware.
  orSetDevice(dev_->index);
  // Named for top -H, gdb and perf: "openreg0-dflt" runs device 0's default
  // stream, "openreg0-strm" one of its other streams.
  char name[16];
  std::snprintf(name, sizeof(name), "openreg%d-%s", dev_->index,
                is_default_ ? "dflt" : "strm");
  pthread_setname_np(pthread_self(), name);
  // A device has its own floating-point mode: the default one (round to
  // nearest, denormals kept), not the one of the host thread that happened
  // to start this worker (a thread inherits its creator's, so
  // torch.set_flush_denormal on the host would reach the device's kernels
  // or not depending on when the worker started).
  std::fesetenv(FE_DFL_ENV);
  bool may_hold_threads = false;  // ran a kernel with host_threads
  const bool watchdog = openreg_rt::kernel_timeout_ns() != 0;
  for (;;) {
    Slot& slot = ring_[head_ % kCapacity];
    auto published = [&] {
      return slot.seq.load(std::memory_order_acquire) == head_ + 1;
    };
    if (!published()) {
      const auto until = Clock::now() + kSpin;
      while (!published() && Clock::now() < until) {
        std::this_thread::yield();
      }
    }
    if (!published()) {
      std::unique_lock<std::mutex> lock(worker_mu_);
      worker_state_.store(kSleeping, std::memory_order_relaxed);
      // Pairs with the fence in wake_worker().
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const auto woken = [&] { return stop_ || published(); };
      // SIMULATOR ONLY: the short spin's window ends when all devices idle.
      while (openreg_device::team_spin_short() &&
             !work_cv_.wait_for(lock, openreg_device::kSpinWindow, woken)) {
        openreg_device::spin_window().idle(openreg_device::now_ns());
      }
      if (may_hold_threads) {
        work_cv_.wait_for(lock, kIdleRetire, woken);
      } else {
        work_cv_.wait(lock, woken);
      }
      if (!published()) {
        // Stopping with the ring drained, or idle for kIdleRetire: the next
        // launch starts a new worker.
        worker_state_.store(kNoWorker, std::memory_order_relaxed);
        return;
      }
      worker_state_.store(kRunning, std::memory_order_relaxed);
    }
    // The task runs in its slot, which is handed back after it (the slot
    // keeps its parameter buffer for the next launch through it).
    Task& task = slot.task;
    if (task.marker) {
      // Signalled and counted in one critical section (see enqueue_marker).
      std::lock_guard<std::mutex> lock(mu_);
      task.fn();
      release(slot);
      notify_waiters(completed_.fetch_add(1, std::memory_order_seq_cst) + 1);
      continue;
    }
    if (watchdog) {
      // What the watchdog names if this task never ends.
      const char* label = task.kernel != nullptr ? task.name
                          : task.function != nullptr
                              ? task.function->name.c_str()
                              : nullptr;
      note_running(label == nullptr ? "(unnamed)"
                                    : openreg_rt::kernel_label(label, nullptr));
    }
    if (dev_->lost.load(std::memory_order_acquire)) {
      // A lost device runs nothing more: the task is dropped (a kernel's
      // user_data is not handed back; whoever waits sees
      // orErrorDeviceLost).
    } else if (task.kernel != nullptr || task.function != nullptr) {
      may_hold_threads = may_hold_threads || task.host_threads;
      const openreg_device::TimedKernel timed(openreg_rt::host_waiting_now);
      if (task.kernel == nullptr) {
        run_function(task);
      } else if (task.kernel(task.user_data) != 0) {
        record_error(orErrorLaunchFailure);
      }
    } else {
      task.fn();
    }
    if (watchdog) {
      std::lock_guard<std::mutex> lock(running_mu_);
      running_.clear();
    }
    // Captures are released before the task counts as completed.
    release(slot);
    notify_waiters(completed_.fetch_add(1, std::memory_order_seq_cst) + 1);
  }
}

void orStream::release(Slot& slot) {
  Task& task = slot.task;
  task.fn = nullptr;
  task.kernel = nullptr;
  task.user_data = nullptr;
  task.function = nullptr;
  task.bytes = 0;
  task.marker = false;
  task.host_threads = false;
  if (task.params_capacity > kKeptParams) {
    task.params.reset();
    task.params_capacity = 0;
  }
  // Before the count: a launcher waiting for room sees the slot free once
  // the count has passed it.
  slot.seq.store(head_ + kCapacity, std::memory_order_release);
  ++head_;
}
// [/doc:stream-worker]

using namespace openreg_rt;

namespace {

orError_t resolve(orStream_t* stream) {
  if (*stream == nullptr) {
    *stream = device_at(current_device())->default_stream;
  }
  return orSuccess;
}

}  // namespace

namespace openreg_rt {

// See "stream-destroy" below.
void reap_destroyed_streams(Device* dev) {
  std::vector<orStream*> drained;
  {
    std::lock_guard<std::mutex> lock(dev->streams_mutex);
    for (auto it = dev->streams.begin(); it != dev->streams.end();) {
      if ((*it)->destroyed && (*it)->idle()) {
        drained.push_back(*it);
        it = dev->streams.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (orStream* stream : drained) {
    const orError_t err = stream->synchronize();  // idle: at once
    if (stream->proc_ring_ >= 0) {
      proc::stream_destroy(stream);
    }
    if (err != orSuccess && err != orErrorDeviceLost) {
      std::lock_guard<std::mutex> lock(dev->streams_mutex);
      if (dev->destroyed_error == orSuccess) {
        dev->destroyed_error = err;
      }
    }
    delete stream;
  }
}

}  // namespace openreg_rt

extern "C" {

orError_t orDeviceGetDefaultStream(int device, orStream_t* stream) {
  if (stream == nullptr) {
    return orErrorInvalidValue;
  }
  *stream = nullptr;
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_at(device);
  if (dev == nullptr) {
    return orErrorInvalidDevice;
  }
  *stream = dev->default_stream;
  return orSuccess;
}

orError_t orStreamCreateWithPriority(orStream_t* stream, int priority) {
  if (stream == nullptr) {
    return orErrorInvalidValue;
  }
  *stream = nullptr;
  OR_RETURN_IF_ERROR(ensure_init());
  int least = 0;
  int greatest = 0;
  orDeviceGetStreamPriorityRange(&least, &greatest);
  priority = priority > least ? least : priority;
  priority = priority < greatest ? greatest : priority;
  Device* dev = device_at(current_device());
  openreg_rt::reap_destroyed_streams(dev);
  auto* created = new orStream(dev, priority, false);
  if (process_driver()) {
    orError_t err = proc::stream_create(created);
    if (err != orSuccess) {
      {
        std::lock_guard<std::mutex> lock(created->device()->streams_mutex);
        created->device()->streams.erase(created);
      }
      delete created;
      return err;
    }
  }
  *stream = created;
  return orSuccess;
}

orError_t orStreamCreate(orStream_t* stream) {
  return orStreamCreateWithPriority(stream, 0);
}

// [doc:stream-destroy]
// As cudaStreamDestroy: a stream whose work has not finished is destroyed
// for the caller at once, and its work still runs; the stream stays in its
// device's set, so orDeviceSynchronize waits for that work and reports its
// failure, and it is freed once the work has finished (the next stream
// creation, destruction or device synchronization on the device looks). A
// stream that is idle, or of a lost device, is freed here, and its pending
// failure is returned.
orError_t orStreamDestroy(orStream_t stream) {
  if (stream == nullptr || stream->is_default()) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = stream->device();
  openreg_rt::reap_destroyed_streams(dev);
  if (!stream->idle() && !dev->lost.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(dev->streams_mutex);
    stream->destroyed = true;
    return orSuccess;
  }
  orError_t err = stream->synchronize();
  if (stream->proc_ring_ >= 0) {
    proc::stream_destroy(stream);
  }
  {
    std::lock_guard<std::mutex> lock(dev->streams_mutex);
    dev->streams.erase(stream);
  }
  if (err == orErrorDeviceLost && stream->proc_ring_ < 0 && !stream->idle()) {
    // A worker that never finished its task (the watchdog lost the device
    // around it) still uses the stream: it is left, not joined.
    return err;
  }
  delete stream;
  return err;
}

// [/doc:stream-destroy]

orError_t orStreamGetPriority(orStream_t stream, int* priority) {
  if (priority == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  resolve(&stream);
  *priority = stream->priority();
  return orSuccess;
}

orError_t orStreamGetDevice(orStream_t stream, int* device) {
  if (device == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  resolve(&stream);
  *device = stream->device()->index;
  return orSuccess;
}

orError_t orStreamQuery(orStream_t stream) {
  OR_RETURN_IF_ERROR(ensure_init());
  resolve(&stream);
  OR_RETURN_IF_ERROR(check_not_lost(stream->device()));
  return stream->idle() ? orSuccess : orErrorNotReady;
}

orError_t orStreamSynchronize(orStream_t stream) {
  OR_RETURN_IF_ERROR(ensure_init());
  resolve(&stream);
  return stream->synchronize(/*interruptible=*/true);
}

orError_t orLaunchKernel(orStream_t stream, orKernelFn fn, void* user_data) {
  return orLaunchKernelEx(stream, fn, user_data, nullptr);
}

orError_t orLaunchKernelEx(orStream_t stream, orKernelFn fn, void* user_data,
                           const orLaunchAttributes* attributes) {
  const orLaunchAttributes defaults{};
  const orLaunchAttributes& attrs =
      attributes != nullptr ? *attributes : defaults;
  OR_RETURN_IF_ERROR(ensure_init());
  if (process_driver()) {
    // A host function pointer means nothing in another address space:
    // the process driver runs named kernels only (orLaunchFunction).
    return orErrorNotSupported;
  }
  if (fn == nullptr || attrs.hostThreads < 0) {
    return orErrorInvalidValue;
  }
  resolve(&stream);
  OR_RETURN_IF_ERROR(check_not_lost(stream->device()));
  return stream->enqueue_kernel(fn, user_data, attrs.hostThreads, attrs.name);
}

}  // extern "C"
