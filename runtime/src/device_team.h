// openreg-device: how long the device's OpenMP team spins after a region,
// chosen per device process (device_team.cpp).
#pragma once

#include <cstdint>

namespace openreg_device {

// True once a loaded kernel library takes hints as the device runs (the
// workers then time their commands for SpinWindow).
bool team_spin_chosen();

// A kernel library was loaded (`handle`, from dlopen): takes its
// `openreg_team_spin_hint`, if it has one and none was taken yet, as
// OPENREG_TEAM_SPIN says.
void take_team_spin_hint(void* handle);

// How long a window of SpinWindow lasts ("team-spin-choice" in
// device_team.cpp).
constexpr uint64_t kSpinWindowNs = 40'000'000;

// One worker's window of busy time: `ran` adds a command's run, from
// `begin` to `end` (CLOCK_MONOTONIC ns), `host_waited` if a host thread
// waited for a device when it began or ended, and at the end of each window
// sends the hint its busy share and the host's waiting share call for.
struct SpinWindow {
  uint64_t start = 0;
  uint64_t busy = 0;
  uint64_t busy_host_waiting = 0;

  void ran(uint64_t begin, uint64_t end, bool host_waited);
};

}  // namespace openreg_device
