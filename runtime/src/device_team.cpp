// openreg-device: the OpenMP team's spin, chosen per device process.
#include "device_team.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace openreg_device {
namespace {

// [doc:team-spin-choice]
// SIMULATOR ONLY: the device's OpenMP team spins long after a region (the
// next region starts at once) or short (its threads sleep and leave the
// core to the host), as the engine's kernel library sets it through
// `openreg_team_spin_hint` ("team-spin" there). Each device process owns
// its libgomp, so each chooses for itself, over windows of kSpinWindowNs,
// from two shares: the time its workers spend running commands, and of
// that time, the part during which a host thread waited for a device
// (Control::host_waiting, read as each command begins and ends). The loop
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
// and the choice flipped every few windows.
// Sent on a change only. OPENREG_TEAM_SPIN=long|short fixes the choice
// instead (long: libgomp's default, no hint at all); validated by the host
// (device.cpp).
void (*g_team_spin_hint)(int) = nullptr;
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
  if (g_team_spin_hint != nullptr &&
      g_team_spin_state.load(std::memory_order_relaxed) != host_bound &&
      g_team_spin_state.exchange(host_bound) != host_bound) {
    g_team_spin_hint(host_bound);
  }
}

}  // namespace

bool team_spin_chosen() { return g_team_spin_hint != nullptr; }

void take_team_spin_hint(void* handle) {
  if (g_team_spin_hint == nullptr && team_spin_setting() != 1) {
    auto* hint = reinterpret_cast<void (*)(int)>(
        dlsym(handle, "openreg_team_spin_hint"));
    if (hint != nullptr && team_spin_setting() == 2) {
      hint(1);  // short from the start; no windows
    } else {
      g_team_spin_hint = hint;
    }
  }
}

void SpinWindow::ran(uint64_t begin, uint64_t end, bool host_waited) {
  if (g_team_spin_hint == nullptr) {
    return;
  }
  busy += end - begin;
  if (host_waited) {
    busy_host_waiting += end - begin;
  }
  if (start == 0) {
    start = begin;
  }
  if (end - start < kSpinWindowNs) {
    return;
  }
  const double share =
      static_cast<double>(busy) / static_cast<double>(end - start);
  const double waited = busy == 0 ? 0.0
                                  : static_cast<double>(busy_host_waiting) /
                                        static_cast<double>(busy);
  if (share < kHostBoundBusy || waited < kHostRunsWaited) {
    team_spin_hint(1);
  } else if (share > kDeviceBoundBusy && waited > kHostWaitsWaited) {
    team_spin_hint(0);
  }
  start = end;
  busy = 0;
  busy_host_waiting = 0;
}

}  // namespace openreg_device
