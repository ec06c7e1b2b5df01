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
// its libgomp, so each chooses for itself, from the share of the time its
// workers spend running commands over windows of kSpinWindowNs: below
// kHostBoundBusy the device mostly waits for the host, the loop is
// host-bound, and the hint is 1 (short); above kDeviceBoundBusy the host
// has queued ahead, and it is 0 (long). Sent on a change only.
// OPENREG_TEAM_SPIN=long|short fixes the choice instead (long: libgomp's
// default, no hint at all); validated by the host (device.cpp).
void (*g_team_spin_hint)(int) = nullptr;
std::atomic<int> g_team_spin_state{-1};
constexpr uint64_t kSpinWindowNs = 10'000'000;
constexpr double kHostBoundBusy = 0.5;
constexpr double kDeviceBoundBusy = 0.7;
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

void SpinWindow::ran(uint64_t begin, uint64_t end) {
  if (g_team_spin_hint == nullptr) {
    return;
  }
  busy += end - begin;
  if (start == 0) {
    start = begin;
  }
  if (end - start < kSpinWindowNs) {
    return;
  }
  const double share =
      static_cast<double>(busy) / static_cast<double>(end - start);
  if (share < kHostBoundBusy) {
    team_spin_hint(1);
  } else if (share > kDeviceBoundBusy) {
    team_spin_hint(0);
  }
  start = end;
  busy = 0;
}

}  // namespace openreg_device
