// DDP's per-iteration timings (forward, backward compute, backward
// communication) for openreg: without a Timer registered for the device type,
// DistributedDataParallel warns that time stats are only collected for CPU
// and CUDA, and `ddp._get_ddp_logging_data()` has no device times.
//
// A device records its timestamps on the stream, not on the host: the host
// reaches the backward hooks long before the device has run the kernels they
// follow, so host clocks would measure dispatch, not work.
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace openreg::distributed {

namespace {

// [doc:ddp-timer]
class OpenRegTimer final : public c10d::Timer {
 public:
  explicit OpenRegTimer(c10::Device device) : device_(device) {}

  // Called by the reducer on the host thread that dispatches the work: the
  // event marks the current stream's position, and its timestamp is taken
  // when the stream reaches it. The host clock is kept too (the reducer
  // reads it for the forward start).
  void record(Event event) override {
    c10d::Timer::record(event);
    c10::Event& e = event_ref(event);
    const auto* impl =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
    e.record(impl->getStream(device_));
  }

  // Waits for both events (the reducer asks once per logged iteration, after
  // the backward pass), then returns the device time between them; nothing
  // when one of them was not recorded this iteration (no communication, for
  // example) or the clocks disagree.
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& s = event_ref(start);
    c10::Event& e = event_ref(end);
    if (!s.was_marked_for_recording() || !e.was_marked_for_recording()) {
      return std::nullopt;
    }
    s.synchronize();
    e.synchronize();
    const double ms = s.elapsedTime(e);
    if (ms < 0) {
      return std::nullopt;
    }
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Event& event_ref(Event event) {
    switch (event) {
      case Event::kForwardStart:
        return forward_start_;
      case Event::kBackwardComputeStart:
        return backward_compute_start_;
      case Event::kBackwardComputeEnd:
        return backward_compute_end_;
      case Event::kBackwardCommStart:
        return backward_comm_start_;
      case Event::kBackwardCommEnd:
        return backward_comm_end_;
    }
    TORCH_INTERNAL_ASSERT(false, "unknown DDP timer event ",
                          static_cast<int>(event));
  }

  static c10::Event timing_event() {
    // BACKEND_DEFAULT = timing enabled (as torch.Event(enable_timing=True)).
    return c10::Event(c10::DeviceType::PrivateUse1,
                      c10::EventFlag::BACKEND_DEFAULT);
  }

  c10::Device device_;
  c10::Event forward_start_ = timing_event();
  c10::Event backward_compute_start_ = timing_event();
  c10::Event backward_compute_end_ = timing_event();
  c10::Event backward_comm_start_ = timing_event();
  c10::Event backward_comm_end_ = timing_event();
};
// [/doc:ddp-timer]

}  // namespace

}  // namespace openreg::distributed

// In c10d's namespace, where the registry is declared.
namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1,
                         openreg::distributed::OpenRegTimer);
}  // namespace c10d
