// The records of device work made while a profiler session records: what
// the hooks (OpenRegProfilerHooks.cpp) write and the Kineto session
// (OpenRegKinetoSession.cpp) reads. Internal to csrc/profiler.
#pragma once

#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace openreg::profiler {

// Kineto's clock: nanoseconds since the epoch of the system clock.
inline int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What a record times.
enum class Work : uint8_t {
  kKernel,  // a kernel queued on a stream (launch_async)
  kCopy,    // a runtime copy queued on a stream (orMemcpyAsync)
  kInline,  // work run on the calling thread after its stream drained
};

// One piece of device work, joined by its flow id from the parts recorded
// on the host and on the device.
struct Launch {
  Work work = Work::kKernel;
  uint64_t correlation = 0;  // the launching operator's, 0 if none
  int32_t thread = 0;        // the session's id of the launching thread
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;
  std::string name;
  int64_t host_begin = 0;  // the launch call on the host
  int64_t host_end = 0;
  int64_t device_begin = 0;  // the work on the device (0: not recorded)
  int64_t device_end = 0;
};

// How the session names threads in its trace (Kineto's system thread id).
using ThreadIdFn = int32_t (*)();

// The records of the current session. Thread-safe. The methods that take
// the lock can throw what std::mutex::lock throws (std::system_error) and
// are not noexcept; callers that must not throw use without_throwing().
class Collector {
 public:
  uint32_t next_flow() noexcept;

  // Starts recording; `thread_id` names the launching threads.
  void start(ThreadIdFn thread_id);
  // Stops recording and waits (bounded) for the work launched while
  // recording to finish, like a real profiler flushing its device buffers.
  void stop();
  std::unordered_map<uint32_t, Launch> drain();

  // A new record for work on `stream`; returns its flow id.
  uint32_t launched(Work work, const c10::Stream& stream, std::string name,
                    int64_t host_begin);
  void launch_returned(uint32_t flow, int64_t t);
  // The device part; a zero time is left as it is.
  void device_span(uint32_t flow, int64_t begin, int64_t end);

  // In-flight accounting for stop(): one count per queued operation from
  // its launch until its device part has been recorded or it is dropped.
  void enter();
  void leave();

  // Two zeroed int64 in pinned host memory for the device part of `flow`,
  // on a device that runs named kernels only: the device stores its clock
  // in the first when its stream reaches the work and in the second after
  // it (kernels/OpenRegKernelLibrary.cpp, openreg_profiler_stamp); stop()
  // reads them. nullptr when the session's kStampPairs are used up or
  // pinned memory cannot be had: the record then has no device part.
  int64_t* stamp_pair(uint32_t flow);
  static constexpr size_t kStampPairs = size_t{1} << 16;  // 1 MiB pinned

 private:
  // In stop(): waits (bounded) for the stamps of the session and records
  // them as device spans.
  void collect_stamps();

  std::atomic<uint32_t> next_flow_{1};
  std::mutex mutex_;  // guards records_ and in_flight_
  std::condition_variable idle_;
  std::unordered_map<uint32_t, Launch> records_;
  int64_t in_flight_ = 0;
  std::atomic<ThreadIdFn> thread_id_{nullptr};  // set by start()
  // Guarded by mutex_: the pinned pairs (allocated on first use, never
  // freed, like the collector), how many this session handed out, and
  // which flow each belongs to.
  int64_t* stamps_ = nullptr;
  bool stamps_unavailable_ = false;
  size_t stamps_used_ = 0;
  std::vector<std::pair<uint32_t, size_t>> pending_stamps_;
};

// The process's collector; never destroyed (workers may still record at
// exit).
Collector& collector();

// The correlation ids Kineto pushes for the operators running on this
// thread (innermost last).
std::vector<uint64_t>& correlation_stack();

// Runs `f` where no exception may escape: destructors, the runtime's C
// callbacks, and the noexcept ends of the hooks. What can throw there is the
// collector's lock; the record then misses that part, with a warning.
template <typename F>
void without_throwing(const char* what, F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    try {
      TORCH_WARN("openreg profiler: ", what, " not recorded: ", e.what());
    } catch (...) {  // the warning itself failed (allocation): drop it
    }
  }
}

}  // namespace openreg::profiler
