// The device's OpenMP team's spin, chosen by a device process for its own
// libgomp, or by the thread driver for the user's process.
#include "device_team.h"

#include <dlfcn.h>
#include <time.h>

#include <cstdlib>
#include <cstring>

namespace openreg_device {
namespace {

// [doc:team-spin-choice]
// SIMULATOR ONLY: the device's OpenMP team spins long after a region (the
// next region starts at once) or short (its threads sleep and leave the
// core to the host), as the engine's kernel library sets it through
// `openreg_team_spin_hint` ("team-spin" there). Each device process owns
// its libgomp, so each chooses for itself; the thread driver's devices
// share the user process's, and choose for it together. The choice is made
// over windows of kSpinWindowNs, from two shares: the time the workers
// spend running commands, and of that time, the part during which a host
// thread waited for a device (read as each command begins and ends:
// Control::host_waiting in a device process, the count itself in the
// thread driver). The loop
// is host-bound, and the hint is 1 (short), when the device is busy less
// than kHostBoundBusy of the window, or when the host waited through less
// than kHostRunsWaited of the device's work: the host's Python ran beside
// the device, and a spinning team thread would take its core. It is
// device-bound, and the hint is 0 (long), when the device is busy more than
// kDeviceBoundBusy and the host waited through more than kHostWaitsWaited
// of it: the host has queued ahead and sleeps. Between the two, the choice
// stays. The busy share alone could not tell: a spinning team makes the
// device's kernels slower on a machine the host's Python shares, so a
// host-bound loop that once went long looked device-bound from then on
// (Lightning on 2 cores: the device busy 0.97-0.999 of each window while
// long, 0.4-0.8 while short; its host waited through none of it). A window
// is 40 ms: in 10 ms ones, a loop that synchronizes every 20 ms (bench.py's
// MLP with dropouts: the host runs ahead, then waits) showed the host
// waiting through 0 to 1 of the device's work from one window to the next,
// and the choice flipped every few windows. The workers of all streams add
// to one window: per worker, a stream used now and then (copies beside the
// default stream's kernels) looked idle and flipped the process's choice at
// each of its commands. In the thread driver the host's own CPU work shares
// the choice, so a device idle for a whole window sets the long spin back,
// libgomp's default (SpinWindow::idle). A pause of the device for a whole
// window (the host sleeping, loading data) is not judged: the window starts
// afresh at the next command, and the choice the pause found stays.
// Sent on a change only. OPENREG_TEAM_SPIN=long|short fixes the choice
// instead (long: libgomp's default, no hint at all); validated by the host
// (device.cpp).
// Set once, at a kernel library's load; read by the workers.
std::atomic<void (*)(int)> g_team_spin_hint{nullptr};
std::atomic<int> g_team_spin_state{-1};
constexpr double kHostBoundBusy = 0.5;
constexpr double kDeviceBoundBusy = 0.7;
constexpr double kHostRunsWaited = 0.25;
constexpr double kHostWaitsWaited = 0.75;
// [/doc:team-spin-choice]

// 0: chosen as the device runs, 1: long, 2: short (OPENREG_TEAM_SPIN).
int team_spin_setting() {
  const char* env = std::getenv("OPENREG_TEAM_SPIN");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) {
    return 0;
  }
  return std::strcmp(env, "short") == 0 ? 2 : 1;
}

void team_spin_hint(int host_bound) {
  void (*hint)(int) = g_team_spin_hint.load(std::memory_order_acquire);
  if (hint != nullptr &&
      g_team_spin_state.load(std::memory_order_relaxed) != host_bound &&
      g_team_spin_state.exchange(host_bound) != host_bound) {
    hint(host_bound);
  }
}

}  // namespace

bool team_spin_chosen() {
  return g_team_spin_hint.load(std::memory_order_relaxed) != nullptr;
}

bool team_spin_short() {
  return g_team_spin_state.load(std::memory_order_relaxed) == 1;
}

void take_team_spin_hint(void* handle) {
  if (!team_spin_chosen() && team_spin_setting() != 1) {
    auto* hint = reinterpret_cast<void (*)(int)>(
        dlsym(handle, "openreg_team_spin_hint"));
    if (hint != nullptr && team_spin_setting() == 2) {
      hint(1);  // short from the start; no windows
    } else {
      g_team_spin_hint.store(hint, std::memory_order_release);
    }
  }
}

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull +
         static_cast<uint64_t>(ts.tv_nsec);
}

void SpinWindow::ran(uint64_t begin, uint64_t end, bool host_waited) {
  if (!team_spin_chosen()) {
    return;
  }
  // The device sat idle for a whole window before this command (the host
  // paused: a data loader, a sleep, an evaluation). A window around the
  // pause says nothing of the loop, and closing it would call any loop
  // host-bound and put the next window's kernels on the short spin (a
  // dropout MLP's 20 calls after each 50 ms sleep took 1.5-2.4 ms a call
  // instead of 1.0). The window starts afresh here; the choice stays. (The
  // thread driver's worker already did this in idle(), start_ 0, which also
  // set the long spin back for the host's own CPU work.)
  const uint64_t last = last_end_.load(std::memory_order_relaxed);
  if (last != 0 && begin >= last + kSpinWindowNs &&
      start_.load(std::memory_order_relaxed) != 0) {
    const std::lock_guard<std::mutex> lock(closing_);
    if (last_end_.load(std::memory_order_relaxed) == last) {
      restart();  // this command starts the new window, below
    }
  }
  const uint64_t run = end - begin;
  busy_.fetch_add(run, std::memory_order_relaxed);
  if (host_waited) {
    busy_host_waiting_.fetch_add(run, std::memory_order_relaxed);
  }
  last_end_.store(end, std::memory_order_relaxed);
  uint64_t start = start_.load(std::memory_order_relaxed);
  if (start == 0 && start_.compare_exchange_strong(start, begin)) {
    start = begin;
  }
  // Compared so, not as end - start: another worker may have closed the
  // window after this command ended.
  if (end < start + kSpinWindowNs) {
    return;
  }
  std::unique_lock<std::mutex> lock(closing_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return;  // another worker closes it
  }
  start = start_.load(std::memory_order_relaxed);
  if (end < start + kSpinWindowNs) {
    return;
  }
  const uint64_t busy = busy_.exchange(0, std::memory_order_relaxed);
  const uint64_t waited_ns =
      busy_host_waiting_.exchange(0, std::memory_order_relaxed);
  start_.store(end, std::memory_order_relaxed);
  const double share =
      static_cast<double>(busy) / static_cast<double>(end - start);
  const double waited =
      busy == 0 ? 0.0
                : static_cast<double>(waited_ns) / static_cast<double>(busy);
  if (share < kHostBoundBusy || waited < kHostRunsWaited) {
    team_spin_hint(1);
  } else if (share > kDeviceBoundBusy && waited > kHostWaitsWaited) {
    team_spin_hint(0);
  }
}

void SpinWindow::idle(uint64_t now) {
  if (!team_spin_chosen()) {
    return;
  }
  const std::lock_guard<std::mutex> lock(closing_);
  if (now < last_end_.load(std::memory_order_relaxed) + kSpinWindowNs) {
    return;  // a worker ran a command within the window
  }
  restart();
  team_spin_hint(0);
}

void SpinWindow::restart() {
  start_.store(0, std::memory_order_relaxed);
  busy_.store(0, std::memory_order_relaxed);
  busy_host_waiting_.store(0, std::memory_order_relaxed);
}

TimedKernel::TimedKernel(bool (*host_waiting)(), bool counts)
    : host_waiting_(host_waiting), timed_(counts && team_spin_chosen()) {
  if (timed_) {
    begin_ = now_ns();
    waited_ = host_waiting_();
  }
}

TimedKernel::~TimedKernel() {
  if (timed_) {
    const uint64_t end = now_ns();
    spin_window().ran(begin_, end, waited_ || host_waiting_());
  }
}

SpinWindow& spin_window() {
  static SpinWindow* window = new SpinWindow();  // workers may run at exit
  return *window;
}

}  // namespace openreg_device
