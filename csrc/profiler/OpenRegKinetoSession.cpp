// The Kineto plugin: openreg's device work as Kineto activities
// (torch.profiler with ProfilerActivity.PrivateUse1, or
// torch.autograd.profiler.profile(use_device="openreg")).
//
// An IActivityProfiler registered with REGISTER_PRIVATEUSE1_PROFILER. Kineto
// creates a session per trace, tells it the correlation id of every operator
// as the operator starts and ends on its thread, and at the end asks it for
// its activities. The session turns the collector's records (made by the
// hooks of OpenRegProfiler.h) into a runtime activity on the launching
// thread and a kernel or memcpy on the device's stream row, both linked to
// the operator and joined by a flow.
//
// Built only when the installed torch ships Kineto's headers
// (csrc/CMakeLists.txt adds this file then); without it the hooks never
// record, since only a session starts recording.
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <time_since_epoch.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "profiler/OpenRegProfiler.h"
#include "profiler/OpenRegProfilerCollector.h"

namespace openreg::profiler {

namespace {

using libkineto::ActivityType;

constexpr int64_t kDeviceSortBase = 1 << 24;  // device rows below the CPU's

// Threads are named as Kineto names the CPU operators' threads.
int32_t kineto_thread_id() { return libkineto::systemThreadId(); }

// The host call that launched the work, for its runtime activity.
const char* runtime_call(Work work) {
  switch (work) {
    case Work::kKernel:
      return "orLaunchKernel";
    case Work::kCopy:
      return "orMemcpyAsync";
    case Work::kInline:
      return "run_sync";
  }
  return "openreg";  // unreachable: every Work is named above
}

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
    collector().start(&kineto_thread_id);
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
      auto& act = add(ActivityType::PRIVATEUSE1_RUNTIME, runtime_call(r.work));
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

}  // namespace openreg::profiler
