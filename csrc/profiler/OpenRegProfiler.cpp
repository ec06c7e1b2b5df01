// openreg device activity in the PyTorch profiler.
//
// Two integration points, both PyTorch's:
//
// - Kineto (torch.profiler with ProfilerActivity.PrivateUse1, or
//   torch.autograd.profiler.profile(use_device="openreg")): an
//   IActivityProfiler registered with REGISTER_PRIVATEUSE1_PROFILER. Kineto
//   creates a session per trace, tells it the correlation id of every
//   operator as the operator starts and ends on its thread, and at the end
//   asks it for its activities. The execution paths (launch_async, run_sync,
//   queued copies) record each piece of device work through the hooks of
//   OpenRegProfiler.h; the session turns the records into a runtime activity
//   on the launching thread and a kernel or memcpy on the device's stream
//   row, both linked to the operator and joined by a flow.
// - The legacy fallback (use_device="openreg", use_kineto=False): the
//   ProfilerStubs of registerPrivateUse1Methods. PyTorch records an openreg
//   event on the current stream when each operator starts and ends, and
//   takes the elapsed time between the two as the operator's device time.
#include "profiler/OpenRegProfiler.h"

#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"

#ifdef USE_KINETO
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <time_since_epoch.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#endif

namespace openreg::profiler {

namespace detail {
std::atomic<bool> g_recording{false};
}  // namespace detail

namespace {

// Kineto's clock: nanoseconds since the epoch of the system clock.
int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

enum class Work : uint8_t { kKernel, kCopy, kInline };

// One piece of device work, joined by its flow id from the parts recorded
// on the host and on the device.
struct Launch {
  Work work = Work::kKernel;
  uint64_t correlation = 0;  // the launching operator's, 0 if none
  int32_t thread = 0;        // Kineto's system id of the launching thread
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;
  std::string name;
  int64_t host_begin = 0;  // the launch call on the host
  int64_t host_end = 0;
  int64_t device_begin = 0;  // the work on the device (0: not recorded)
  int64_t device_end = 0;
};

// The records of the current session. Thread-safe; every method is called
// only while a session exists or is being drained.
class Collector {
 public:
  uint32_t next_flow() noexcept {
    // Flow ids are unique in the process (0 means "no flow").
    uint32_t id = next_flow_.fetch_add(1, std::memory_order_relaxed);
    return id == 0 ? next_flow_.fetch_add(1, std::memory_order_relaxed) : id;
  }

  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    records_.clear();
    detail::g_recording.store(true, std::memory_order_relaxed);
  }

  // Stops recording and waits (bounded) for the work launched while
  // recording to finish, like a real profiler flushing its device buffers.
  void stop() {
    detail::g_recording.store(false, std::memory_order_relaxed);
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

  std::unordered_map<uint32_t, Launch> drain() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(records_, {});
  }

  void launched(uint32_t flow, Launch launch) {
    std::lock_guard<std::mutex> lock(mutex_);
    records_[flow] = std::move(launch);
  }

  void launch_returned(uint32_t flow, int64_t t) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = records_.find(flow);
    if (it != records_.end()) {
      it->second.host_end = t;
    }
  }

  // Called on the device side; never throws.
  void device_span(uint32_t flow, int64_t begin, int64_t end) noexcept {
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

  // In-flight accounting for stop(): one count per queued operation from
  // its launch until its device part has been recorded or it is dropped.
  void enter() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_flight_;
  }
  void leave() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--in_flight_ == 0) {
      idle_.notify_all();
    }
  }

 private:
  std::atomic<uint32_t> next_flow_{1};
  std::mutex mutex_;  // guards records_ and in_flight_
  std::condition_variable idle_;
  std::unordered_map<uint32_t, Launch> records_;
  int64_t in_flight_ = 0;
};

Collector& collector() {
  static Collector* c = new Collector();  // never destroyed: workers may
  return *c;                              // still record at exit
}

// The correlation ids Kineto pushes for the operators running on this
// thread (innermost last).
std::vector<uint64_t>& correlation_stack() {
  thread_local std::vector<uint64_t> stack;
  return stack;
}

uint64_t current_correlation() noexcept {
  const auto& stack = correlation_stack();
  return stack.empty() ? 0 : stack.back();
}

int32_t current_thread() noexcept {
#ifdef USE_KINETO
  return libkineto::systemThreadId();
#else
  return 0;
#endif
}

// Starts a launch record for work on `stream`; returns its flow id.
uint32_t record_launch(Work work, const c10::Stream& stream, std::string name,
                       int64_t host_begin) {
  Launch launch;
  launch.work = work;
  launch.correlation = current_correlation();
  launch.thread = current_thread();
  launch.device = stream.device_index();
  launch.stream = stream.id();
  launch.name = std::move(name);
  launch.host_begin = host_begin;
  Collector& c = collector();
  const uint32_t flow = c.next_flow();
  c.launched(flow, std::move(launch));
  return flow;
}

// Kept by a wrapped kernel (and its copies): the in-flight count is
// released when the runtime destroys the task, whether it ran or not.
struct InFlight {
  InFlight() { collector().enter(); }
  ~InFlight() { collector().leave(); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
};

// Times the wrapped kernel on the worker, even if it throws.
struct DeviceSpan {
  uint32_t flow;
  int64_t begin = now_ns();
  ~DeviceSpan() { collector().device_span(flow, begin, now_ns()); }
};

int stamp_begin(void* data) {
  collector().device_span(
      static_cast<uint32_t>(reinterpret_cast<uintptr_t>(data)), now_ns(), 0);
  return 0;
}

int stamp_end(void* data) {
  collector().device_span(
      static_cast<uint32_t>(reinterpret_cast<uintptr_t>(data)), 0, now_ns());
  collector().leave();
  return 0;
}

void* as_data(uint32_t flow) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(flow));
}

const char* copy_name(orMemcpyKind kind) {
  switch (kind) {
    case orMemcpyHostToDevice:
      return "Memcpy HtoD (Pinned -> openreg)";
    case orMemcpyDeviceToHost:
      return "Memcpy DtoH (openreg -> Pinned)";
    case orMemcpyDeviceToDevice:
      return "Memcpy DtoD (openreg -> openreg)";
    default:
      return "Memcpy";
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Hooks
// ---------------------------------------------------------------------------

// [doc:queued-kernel]
void QueuedKernel::begin(const c10::Stream& stream, const std::string& op,
                         std::function<void()>& kernel) {
  const int64_t t = now_ns();
  const uint32_t flow = record_launch(Work::kKernel, stream, op, t);
  kernel = [inner = std::move(kernel), flow,
            token = std::make_shared<InFlight>()]() {
    const DeviceSpan span{flow};
    inner();
  };
  flow_ = flow;
}

void QueuedKernel::end() noexcept {
  try {
    collector().launch_returned(flow_, now_ns());
  } catch (...) {  // a lock failure: the record keeps no host end
  }
}
// [/doc:queued-kernel]

void QueuedCopy::begin(const c10::Stream& stream, orMemcpyKind kind) {
  const int64_t t = now_ns();
  const uint32_t flow = record_launch(Work::kCopy, stream, copy_name(kind), t);
  stream_ = native_stream(stream);
  // A failed stamp leaves the record without a device part; the copy itself
  // is unaffected.
  (void)orLaunchKernel(stream_, &stamp_begin, as_data(flow));
  collector().enter();
  flow_ = flow;
}

void QueuedCopy::end() noexcept {
  if (orLaunchKernel(stream_, &stamp_end, as_data(flow_)) != orSuccess) {
    collector().leave();
  }
  try {
    collector().launch_returned(flow_, now_ns());
  } catch (...) {
  }
}

void InlineKernel::begin(c10::DeviceIndex device) {
  const c10::Stream stream = getCurrentStream(device).unwrap();
  const int64_t t = now_ns();
  flow_ = record_launch(Work::kInline, stream, std::string(), t);
}

void InlineKernel::end() noexcept {
  const int64_t t = now_ns();
  try {
    Collector& c = collector();
    c.launch_returned(flow_, t);
    c.device_span(flow_, 0, t);
  } catch (...) {
  }
}

#ifdef USE_KINETO

// ---------------------------------------------------------------------------
// Kineto session
// ---------------------------------------------------------------------------

namespace {

using libkineto::ActivityType;

constexpr int64_t kDeviceSortBase = 1 << 24;  // device rows below the CPU's

std::string device_row(c10::DeviceIndex device) {
  return "openreg:" + std::to_string(device);
}

libkineto::DeviceInfo device_info(c10::DeviceIndex device) {
  return libkineto::DeviceInfo{device, kDeviceSortBase + device,
                               device_row(device), "openreg"};
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(const std::set<ActivityType>& types)
      : kernels_(types.count(ActivityType::CONCURRENT_KERNEL) != 0),
        copies_(types.count(ActivityType::GPU_MEMCPY) != 0),
        runtime_(types.count(ActivityType::PRIVATEUSE1_RUNTIME) != 0) {}

  ~Session() override {
    if (status_ == libkineto::TraceStatus::RECORDING) {
      detail::g_recording.store(false, std::memory_order_relaxed);
    }
  }

  void start() override {
    collector().start();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    collector().stop();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  // [doc:correlation]
  // Kineto calls these on the operator's own thread as it starts and ends.
  void pushCorrelationId(uint64_t id) override {
    correlation_stack().push_back(id);
  }
  void popCorrelationId() override {
    auto& stack = correlation_stack();
    if (!stack.empty()) {
      stack.pop_back();
    }
  }
  // [/doc:correlation]

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(
        logger, [](int32_t) { return nullptr; }, 0,
        std::numeric_limits<int64_t>::max());
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked_activity,
                    int64_t start_time, int64_t end_time) override;

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Kineto takes one device from here; processTrace logged the others.
    return std::make_unique<libkineto::DeviceInfo>(
        device_info(devices_.empty() ? 0 : *devices_.begin()));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : streams_) {
      out.push_back(libkineto::ResourceInfo{
          stream, stream, device, "stream " + std::to_string(stream)});
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }

 private:
  libkineto::GenericTraceActivity& add(ActivityType type,
                                       const std::string& name) {
    buffer_->emplace_activity(buffer_->span, type, name);
    return libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
  }

  const bool kernels_;
  const bool copies_;
  const bool runtime_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<c10::DeviceIndex> devices_;
  std::set<std::pair<c10::DeviceIndex, c10::StreamId>> streams_;
};

// [doc:process-trace]
void Session::processTrace(libkineto::ActivityLogger& logger,
                           libkineto::getLinkedActivityCallback linked_activity,
                           int64_t start_time, int64_t end_time) {
  // Flow order is launch order.
  std::map<uint32_t, Launch> records;
  for (auto& [flow, launch] : collector().drain()) {
    records.emplace(flow, std::move(launch));
  }
  buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
  buffer_->span = libkineto::TraceSpan(start_time, end_time, "openreg");
  buffer_->gpuOpCount = 0;
  const int32_t pid = libkineto::processId();
  for (auto& [flow, r] : records) {
    const bool is_copy = r.work == Work::kCopy;
    if (r.work == Work::kInline) {  // ran in the launch call itself
      r.device_begin = r.host_begin;
    }
    const bool on_device = r.device_begin != 0 && r.device_end != 0 &&
                           (is_copy ? copies_ : kernels_);
    // The operator that launched the work: its correlation id is the one
    // Kineto pushed on the launching thread.
    const libkineto::ITraceActivity* op =
        r.correlation != 0
            ? linked_activity(static_cast<int32_t>(r.correlation))
            : nullptr;
    // A kernel is named after the operator it runs (the launch names it;
    // inline work takes its operator's name), marked so that tables do not
    // mix it up with the operator's own row.
    if (r.work == Work::kKernel) {
      r.name += " [kernel]";
    } else if (r.work == Work::kInline) {
      r.name = (op != nullptr ? op->name() : "openreg") + " [sync]";
    }
    if (runtime_) {
      static const char* const kRuntimeNames[] = {"orLaunchKernel",
                                                  "orMemcpyAsync", "run_sync"};
      auto& act = add(ActivityType::PRIVATEUSE1_RUNTIME,
                      kRuntimeNames[static_cast<int>(r.work)]);
      act.device = pid;
      act.resource = r.thread;
      act.threadId = r.thread;
      act.startTime = r.host_begin;
      act.endTime = r.host_end != 0 ? r.host_end : r.host_begin;
      act.id = op != nullptr ? static_cast<int32_t>(flow) : 0;
      act.linked = op;
      if (on_device) {
        act.flow.id = flow;
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        act.flow.start = 1;
      }
      act.log(logger);
    }
    if (!on_device) {
      continue;
    }
    auto& act = add(
        is_copy ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL,
        r.name);
    act.device = r.device;
    act.resource = static_cast<int32_t>(r.stream);
    act.startTime = r.device_begin;
    act.endTime = r.device_end;
    act.id = op != nullptr ? static_cast<int32_t>(flow) : 0;
    act.linked = op;
    if (runtime_) {
      act.flow.id = flow;
      act.flow.type = libkineto::kLinkAsyncCpuGpu;
      act.flow.start = 0;
    }
    act.addMetadataQuoted("device", device_row(r.device));
    act.addMetadataQuoted("stream", std::to_string(r.stream));
    act.log(logger);
    ++buffer_->gpuOpCount;
    devices_.insert(r.device);
    streams_.emplace(r.device, r.stream);
  }
  // Kineto asks getDeviceInfo() for a single device; name the rest here.
  for (c10::DeviceIndex device : devices_) {
    if (device != *devices_.begin()) {
      logger.handleDeviceInfo(device_info(device), start_time);
    }
  }
}
// [/doc:process-trace]

// [doc:activity-profiler]
class OpenRegActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    static const std::string name = "openreg";
    return name;
  }

  const std::set<ActivityType>& availableActivities() const override {
    static const std::set<ActivityType> types = {
        ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
        ActivityType::PRIVATEUSE1_RUNTIME};
    return types;
  }

  // A session only when device activity is asked for (ProfilerActivity.
  // PrivateUse1): a CPU-only trace leaves the launch path untouched.
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& types,
      const libkineto::Config& /*config*/) override {
    if (types.count(ActivityType::CONCURRENT_KERNEL) == 0 &&
        types.count(ActivityType::GPU_MEMCPY) == 0) {
      return nullptr;
    }
    return std::make_unique<Session>(types);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/,
      const std::set<ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }
};

REGISTER_PRIVATEUSE1_PROFILER(OpenRegActivityProfiler);
// [/doc:activity-profiler]

}  // namespace

#endif  // USE_KINETO

// ---------------------------------------------------------------------------
// Legacy fallback: events around each operator
// ---------------------------------------------------------------------------

namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

// [doc:profiler-stubs]
struct OpenRegStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) {
      *device = index;
    }
    orEvent_t created = nullptr;
    OPENREG_CHECK(orEventCreate(&created));
    *event = ProfilerVoidEventStub(created, [](void* e) {
      OPENREG_CHECK_WARN(orEventDestroy(static_cast<orEvent_t>(e)));
    });
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
    OPENREG_CHECK(orEventRecord(created, getCurrentStream(index).native()));
  }

  // Microseconds between the completions of two recorded events.
  float elapsed(const ProfilerVoidEventStub* event,
                const ProfilerVoidEventStub* event2) const override {
    auto* start = static_cast<orEvent_t>(event->get());
    auto* end = static_cast<orEvent_t>(event2->get());
    OPENREG_CHECK(orEventSynchronize(start));
    OPENREG_CHECK(orEventSynchronize(end));
    float ms = 0;
    OPENREG_CHECK(orEventElapsedTime(&ms, start, end));
    return ms * 1000.0f;
  }

  // The simulated device has no range-annotation tool (NVTX's role) to
  // forward these to.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    for (const auto i : c10::irange(device_count())) {
      const ScopedDevice guard(i);
      op(i);
    }
  }

  void synchronize() const override { synchronize_device(current_device()); }
};

struct RegisterStubs {
  RegisterStubs() {
    static OpenRegStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};
const RegisterStubs register_stubs;
// [/doc:profiler-stubs]

}  // namespace

}  // namespace openreg::profiler
