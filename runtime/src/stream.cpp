// Streams: in-order queues, each drained by one worker thread.
#include <chrono>

#include "runtime_internal.h"

using openreg_rt::Device;

orStream::orStream(Device* dev, int priority, bool is_default)
    : dev_(dev), priority_(priority), is_default_(is_default) {
  std::lock_guard<std::mutex> lock(dev_->streams_mutex);
  dev_->streams.insert(this);
}

orStream::~orStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) {
    worker_.join();
  }
}

void orStream::enqueue(std::function<void()> task) {
  push(Task{std::move(task), nullptr, nullptr, false});
}

void orStream::enqueue_kernel(orKernelFn fn, void* user_data) {
  push(Task{nullptr, fn, user_data, false});
}

void orStream::enqueue_marker(std::function<void()> signal) {
  push(Task{std::move(signal), nullptr, nullptr, true});
}

void orStream::push(Task task) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ++enqueued_;
    if (!worker_alive_) {
      if (worker_.joinable()) {
        worker_.join();  // it retired when idle and holds no lock
      }
      worker_alive_ = true;
      worker_ = std::thread([this] { run(); });
    }
    wake = sleeping_;
    pushed_.fetch_add(1, std::memory_order_release);
  }
  // A worker that is still spinning finds the task without a wake-up.
  if (wake) {
    work_cv_.notify_one();
  }
}

bool orStream::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ == enqueued_;
}

orError_t orStream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = enqueued_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
  orError_t err = error_;
  error_ = orSuccess;
  return err;
}

void orStream::record_error(orError_t err) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_ == orSuccess) {
    error_ = err;
  }
}

// [doc:stream-worker]
// The worker: runs the stream's tasks in order. Idle, it spins briefly
// (launches come in bursts, and waking a sleeping thread costs the launcher
// a system call), then sleeps; after kIdleRetire without work it retires,
// and the next launch starts a new worker. Retiring matters for the process
// around it: the CPU kernels a worker runs give it a thread pool of its own
// (OpenMP's), and while that pool exists beside the main thread's, OpenMP
// sees more threads than cores and makes every thread of every pool sleep
// at once after each parallel region, which slows the host's own CPU work
// several times over.
void orStream::run() {
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr auto kIdleRetire = std::chrono::milliseconds(10);
  // Kernels run with the stream's device current, as they would on hardware.
  orSetDevice(dev_->index);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty() && !stop_) {
      // The spin reads an atomic counter, never the mutex, so it does not
      // slow down the launching thread.
      const uint64_t seen = pushed_.load(std::memory_order_acquire);
      lock.unlock();
      const auto until = std::chrono::steady_clock::now() + kSpin;
      while (pushed_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      lock.lock();
    }
    sleeping_ = true;
    work_cv_.wait_for(lock, kIdleRetire,
                      [&] { return stop_ || !queue_.empty(); });
    sleeping_ = false;
    if (queue_.empty()) {
      // Drained and stopping, or idle for kIdleRetire: push() starts a new
      // worker for the next task.
      worker_alive_ = false;
      return;
    }
    Task task = std::move(queue_.front());
    queue_.pop_front();
    if (task.marker) {
      // Signalled and counted in one critical section (see enqueue_marker).
      task.fn();
      task.fn = nullptr;
      ++completed_;
      done_cv_.notify_all();
      continue;
    }
    lock.unlock();
    if (task.kernel != nullptr) {
      if (task.kernel(task.user_data) != 0) {
        record_error(orErrorLaunchFailure);
      }
    } else {
      task.fn();
      task.fn = nullptr;  // release captures before reporting completion
    }
    lock.lock();
    ++completed_;
    done_cv_.notify_all();
  }
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
  *stream = new orStream(device_at(current_device()), priority, false);
  return orSuccess;
}

orError_t orStreamCreate(orStream_t* stream) {
  return orStreamCreateWithPriority(stream, 0);
}

orError_t orStreamDestroy(orStream_t stream) {
  if (stream == nullptr || stream->is_default()) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  orError_t err = stream->synchronize();
  {
    Device* dev = stream->device();
    std::lock_guard<std::mutex> lock(dev->streams_mutex);
    dev->streams.erase(stream);
  }
  delete stream;
  return err;
}

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
  return stream->idle() ? orSuccess : orErrorNotReady;
}

orError_t orStreamSynchronize(orStream_t stream) {
  OR_RETURN_IF_ERROR(ensure_init());
  resolve(&stream);
  return stream->synchronize();
}

orError_t orLaunchKernel(orStream_t stream, orKernelFn fn, void* user_data) {
  if (fn == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  resolve(&stream);
  stream->enqueue_kernel(fn, user_data);
  return orSuccess;
}

}  // extern "C"
