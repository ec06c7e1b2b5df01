// Host waits that last: the host wait check (orSetHostWaitCheck) and the
// watchdog (OPENREG_KERNEL_TIMEOUT), shared by both drivers' waits.
#include <atomic>
#include <string>

#include "runtime_internal.h"

namespace openreg_rt {

namespace {

std::atomic<orHostWaitCheckFn> g_check{nullptr};
thread_local bool t_streams_locked = false;

}  // namespace

StreamsLocked::StreamsLocked() { t_streams_locked = true; }
StreamsLocked::~StreamsLocked() { t_streams_locked = false; }

uint64_t device_progress(Device* dev, std::string* running) {
  if (process_driver()) {
    return proc::progress(dev, running);
  }
  uint64_t total = 0;
  std::unique_lock<std::mutex> lock(dev->streams_mutex, std::defer_lock);
  if (!t_streams_locked) {
    lock.lock();
  }
  for (Stream* s : dev->streams) {
    total += s->completed();
    if (running != nullptr && running->empty()) {
      *running = s->running();
    }
  }
  return total;
}

orError_t LongWait::tick() {
  OR_RETURN_IF_ERROR(check_not_lost(dev_));
  if (interruptible_) {
    const orHostWaitCheckFn check = g_check.load(std::memory_order_acquire);
    if (check != nullptr && check() != 0) {
      return orErrorInterrupted;
    }
  }
  const int64_t timeout = kernel_timeout_ns();
  if (timeout == 0) {
    return orSuccess;
  }
  const auto now = std::chrono::steady_clock::now();
  const uint64_t progress = device_progress(dev_, nullptr);
  if (!started_ || progress != progress_) {
    started_ = true;
    progress_ = progress;
    since_ = now;
    return orSuccess;
  }
  if (now - since_ < std::chrono::nanoseconds(timeout)) {
    return orSuccess;
  }
  // [doc:watchdog]
  // No command of the device completed for the whole timeout while this
  // thread waited: the device is hung, as far as the host can tell (a
  // kernel that never ends, a device process stopped with SIGSTOP). A GPU's
  // watchdog resets it (TDR); here the device is lost, naming the kernel.
  std::string running;
  device_progress(dev_, &running);
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g",
                static_cast<double>(timeout) / 1e9);
  std::string reason = "device " + std::to_string(dev_->index) +
                       " was reset by the watchdog: it completed no work for " +
                       seconds + " s (OPENREG_KERNEL_TIMEOUT=" + seconds + ")";
  reason += running.empty() ? ", with no kernel running (is the device "
                              "process stopped?)"
                            : " while running kernel " + running;
  lose_device(dev_, reason.c_str());
  // [/doc:watchdog]
  return orErrorDeviceLost;
}

}  // namespace openreg_rt

using namespace openreg_rt;

extern "C" {

orError_t orSetHostWaitCheck(orHostWaitCheckFn check) {
  g_check.store(check, std::memory_order_release);
  return orSuccess;
}

}  // extern "C"
