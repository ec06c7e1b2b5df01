// The device's OpenMP team: how long it spins after a region, chosen as the
// device runs (device_team.cpp). A device process (openreg-device) chooses
// for its own libgomp; the thread driver for the user's process, whose
// libgomp its stream workers share with the host.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace openreg_device {

// True once a loaded kernel library takes hints as the device runs (the
// workers then time their commands for SpinWindow).
bool team_spin_chosen();

// True while the last hint sent was the short spin.
bool team_spin_short();

// A kernel library was loaded (`handle`, from dlopen): takes its
// `openreg_team_spin_hint`, if it has one and none was taken yet, as
// OPENREG_TEAM_SPIN says.
void take_team_spin_hint(void* handle);

// How long a window of SpinWindow lasts ("team-spin-choice" in
// device_team.cpp).
constexpr uint64_t kSpinWindowNs = 40'000'000;
constexpr std::chrono::nanoseconds kSpinWindow{kSpinWindowNs};

// CLOCK_MONOTONIC, in nanoseconds.
uint64_t now_ns();

// The busy time of a process's workers over a window: `ran` adds a
// command's run, from `begin` to `end` (now_ns), `host_waited` if a host
// thread waited for a device when it began or ended, and at the end of each
// window sends the hint its busy share and the host's waiting share call
// for. Workers of several streams share one (spin_window()): the hint is
// for the whole process's libgomp.
class SpinWindow {
 public:
  void ran(uint64_t begin, uint64_t end, bool host_waited);
  // The thread driver's worker found no work for a window (`now`): if no
  // command of any worker ended in the last kSpinWindowNs, the long spin
  // (libgomp's default) comes back for the host's own CPU work, and the
  // window starts afresh.
  void idle(uint64_t now);

 private:
  // An empty window, started by the next command; the caller holds closing_.
  void restart();

  std::atomic<uint64_t> start_{0};
  std::atomic<uint64_t> busy_{0};
  std::atomic<uint64_t> busy_host_waiting_{0};
  std::atomic<uint64_t> last_end_{0};
  std::mutex closing_;  // the worker that closes a window
};

// The process's window, which every worker adds to.
SpinWindow& spin_window();

// A worker's command, from construction to destruction, added to
// spin_window() with whether `host_waiting()` was true as it began or ended;
// nothing while the choice is fixed or for a command that is not work
// (`counts` false: a wait for an event or a host value).
class TimedKernel {
 public:
  explicit TimedKernel(bool (*host_waiting)(), bool counts = true);
  ~TimedKernel();
  TimedKernel(const TimedKernel&) = delete;
  TimedKernel& operator=(const TimedKernel&) = delete;

 private:
  bool (*host_waiting_)();
  bool timed_;
  bool waited_ = false;
  uint64_t begin_ = 0;
};

}  // namespace openreg_device
