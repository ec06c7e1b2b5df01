// A device process's choice of its OpenMP team's spin ("team-spin-choice" in
// runtime/src/device_team.cpp), driven with made-up command
// timings: this binary is the "kernel library" whose hint it takes.
//
// The choice is process-wide state, taken once; ctest runs each test in its
// own process.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <vector>

#include "device_team.h"

namespace {

std::vector<int> g_hints;  // what the device sent, in order

}  // namespace

// The kernel library's entry point (csrc/engine/kernels), here a recorder;
// the binary exports it (ENABLE_EXPORTS) so that dlsym finds it.
extern "C" __attribute__((visibility("default"))) void openreg_team_spin_hint(
    int host_bound) {
  g_hints.push_back(host_bound);
}

namespace openreg_device {
namespace {

constexpr uint64_t kMs = 1'000'000;

// The device's busy and the host's waiting shares, over one window of
// kSpinWindowNs: the worker runs one command per millisecond, `busy` of it,
// ending with the millisecond, and a host thread waits through the first
// `waited` of the commands (a share). A window starts where the last one
// ended, or at the first command: the first window has one command more, so
// that each ends with its last.
class Device {
 public:
  void window(double busy, double waited) {
    const uint64_t run = static_cast<uint64_t>(busy * kMs);
    const int commands = static_cast<int>(kSpinWindowNs / kMs);
    if (now_ == kStart) {
      spin_.ran(now_ + kMs - run, now_ + kMs, waited > 0);
      now_ += kMs;
    }
    for (int i = 0; i < commands; ++i) {
      spin_.ran(now_ + kMs - run, now_ + kMs, i < waited * commands);
      now_ += kMs;
    }
  }

 private:
  static constexpr uint64_t kStart = 1'000 * kMs;
  SpinWindow spin_;
  uint64_t now_ = kStart;
};

// Takes this binary's hint as a device process takes its kernel library's,
// with OPENREG_TEAM_SPIN set to `setting` (nullptr: unset).
void take_hint_from_this_binary(const char* setting) {
  if (setting == nullptr) {
    unsetenv("OPENREG_TEAM_SPIN");
  } else {
    setenv("OPENREG_TEAM_SPIN", setting, 1);
  }
  void* self = dlopen(nullptr, RTLD_NOW);
  ASSERT_NE(self, nullptr) << dlerror();
  take_team_spin_hint(self);
}

TEST(TeamSpinTest, FollowsTheDeviceAndWhetherTheHostWaits) {
  take_hint_from_this_binary(nullptr);
  ASSERT_TRUE(team_spin_chosen());
  Device device;
  // Device-bound: busy 90%, the host asleep behind its queue: long.
  for (int i = 0; i < 3; ++i) {
    device.window(0.9, 1.0);
  }
  EXPECT_EQ(g_hints, std::vector<int>({0}));
  // Busy as much, but the host ran its Python beside every command: short
  // (a spinning team thread would take the host's core). The busy share
  // alone called this device-bound.
  device.window(0.95, 0.0);
  device.window(0.95, 0.0);
  EXPECT_EQ(g_hints, std::vector<int>({0, 1}));
  // The host waited through half of the work: neither, the choice stays.
  device.window(0.95, 0.5);
  EXPECT_EQ(g_hints, std::vector<int>({0, 1}));
  // It waits through nearly all of it again: long.
  device.window(0.95, 0.9);
  EXPECT_EQ(g_hints, std::vector<int>({0, 1, 0}));
  // Mostly idle, whatever the host does: short.
  device.window(0.3, 1.0);
  EXPECT_EQ(g_hints, std::vector<int>({0, 1, 0, 1}));
  // Busy 60%, between the two busy shares: the choice stays.
  device.window(0.6, 1.0);
  device.window(0.6, 1.0);
  EXPECT_EQ(g_hints, std::vector<int>({0, 1, 0, 1}));
}

TEST(TeamSpinTest, ASettingFixesTheChoice) {
  // OPENREG_TEAM_SPIN=long: libgomp's own spin, no hint is ever sent.
  take_hint_from_this_binary("long");
  EXPECT_FALSE(team_spin_chosen());
  Device device;
  device.window(0.95, 0.0);
  device.window(0.3, 0.0);
  EXPECT_TRUE(g_hints.empty());
}

TEST(TeamSpinTest, ShortIsSentOnceAtTheStart) {
  // OPENREG_TEAM_SPIN=short: the hint at once, and no windows.
  take_hint_from_this_binary("short");
  EXPECT_FALSE(team_spin_chosen());
  EXPECT_EQ(g_hints, std::vector<int>({1}));
  Device device;
  device.window(0.95, 1.0);
  EXPECT_EQ(g_hints, std::vector<int>({1}));
}

}  // namespace
}  // namespace openreg_device
