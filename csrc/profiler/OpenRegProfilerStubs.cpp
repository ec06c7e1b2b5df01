// The legacy profiler's device events
// (torch.autograd.profiler.profile(use_device="openreg", use_kineto=False)):
// the ProfilerStubs of registerPrivateUse1Methods. PyTorch records an
// openreg event on the current stream when each operator starts and ends,
// and takes the elapsed time between the two as the operator's device time.
#include <c10/util/ApproximateClock.h>
#include <c10/util/irange.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <functional>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"

namespace openreg::profiler {

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
    synchronize_event(start);
    synchronize_event(end);
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
