#include "profiler/OpenRegProfilerCollector.h"

#include <openreg.h>

#include <thread>
#include <utility>

#include "profiler/OpenRegProfiler.h"

namespace openreg::profiler {

namespace detail {
std::atomic<bool> g_recording{false};
}  // namespace detail

uint32_t Collector::next_flow() noexcept {
  // Flow ids are unique in the process (0 means "no flow").
  uint32_t id = next_flow_.fetch_add(1, std::memory_order_relaxed);
  return id == 0 ? next_flow_.fetch_add(1, std::memory_order_relaxed) : id;
}

void Collector::start(ThreadIdFn thread_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.clear();
  stamps_used_ = 0;
  pending_stamps_.clear();
  thread_id_.store(thread_id, std::memory_order_relaxed);
  detail::g_recording.store(true, std::memory_order_relaxed);
}

void Collector::stop() {
  detail::g_recording.store(false, std::memory_order_relaxed);
  collect_stamps();
  std::unique_lock<std::mutex> lock(mutex_);
  const bool drained = idle_.wait_for(lock, std::chrono::seconds(10),
                                      [this] { return in_flight_ == 0; });
  if (!drained) {
    TORCH_WARN("openreg profiler: ", in_flight_,
               " device operations launched while profiling had not "
               "finished 10 s after the profiler stopped; they are left "
               "out of the trace");
  }
}

std::unordered_map<uint32_t, Launch> Collector::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(records_, {});
}

uint32_t Collector::launched(Work work, const c10::Stream& stream,
                             std::string name, int64_t host_begin) {
  Launch launch;
  launch.work = work;
  const auto& stack = correlation_stack();
  launch.correlation = stack.empty() ? 0 : stack.back();
  const ThreadIdFn thread_id = thread_id_.load(std::memory_order_relaxed);
  launch.thread = thread_id != nullptr ? thread_id() : 0;
  launch.device = stream.device_index();
  launch.stream = stream.id();
  launch.name = std::move(name);
  launch.host_begin = host_begin;
  const uint32_t flow = next_flow();
  std::lock_guard<std::mutex> lock(mutex_);
  records_[flow] = std::move(launch);
  return flow;
}

void Collector::launch_returned(uint32_t flow, int64_t t) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = records_.find(flow);
  if (it != records_.end()) {
    it->second.host_end = t;
  }
}

void Collector::device_span(uint32_t flow, int64_t begin, int64_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = records_.find(flow);
  if (it != records_.end()) {  // else a previous session's work
    if (begin != 0) {
      it->second.device_begin = begin;
    }
    if (end != 0) {
      it->second.device_end = end;
    }
  }
}

int64_t* Collector::stamp_pair(uint32_t flow) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stamps_ == nullptr && !stamps_unavailable_) {
    void* p = nullptr;
    if (orMallocHost(&p, kStampPairs * 2 * sizeof(int64_t)) == orSuccess) {
      stamps_ = static_cast<int64_t*>(p);
    } else {
      stamps_unavailable_ = true;
      TORCH_WARN(
          "openreg profiler: no pinned memory for device timestamps; "
          "device work is recorded without its device time");
    }
  }
  if (stamps_ == nullptr || stamps_used_ == kStampPairs) {
    return nullptr;
  }
  const size_t index = stamps_used_++;
  int64_t* pair = stamps_ + 2 * index;
  pair[0] = pair[1] = 0;
  pending_stamps_.emplace_back(flow, index);
  return pair;
}

void Collector::collect_stamps() {
  std::vector<std::pair<uint32_t, size_t>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_stamps_);
  }
  // Like the in-flight wait below: work still queued 10 s after the
  // profiler stopped (a stalled or lost device) is left out.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t missing = 0;
  for (const auto& [flow, index] : pending) {
    int64_t* pair = stamps_ + 2 * index;
    while (__atomic_load_n(&pair[1], __ATOMIC_ACQUIRE) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const int64_t begin = __atomic_load_n(&pair[0], __ATOMIC_ACQUIRE);
    const int64_t end = __atomic_load_n(&pair[1], __ATOMIC_ACQUIRE);
    if (begin == 0 || end == 0) {
      ++missing;
    } else {
      device_span(flow, begin, end);
    }
  }
  if (missing > 0) {
    TORCH_WARN("openreg profiler: ", missing,
               " device operations launched while profiling had not "
               "finished 10 s after the profiler stopped; they are left "
               "out of the trace");
  }
}

void Collector::enter() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++in_flight_;
}

void Collector::leave() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (--in_flight_ == 0) {
    idle_.notify_all();
  }
}

Collector& collector() {
  static Collector* c = new Collector();  // never destroyed: workers may
  return *c;                              // still record at exit
}

std::vector<uint64_t>& correlation_stack() {
  thread_local std::vector<uint64_t> stack;
  return stack;
}

}  // namespace openreg::profiler
