// The choice of the device's OpenMP team's spin ("team-spin-choice" in
// runtime/src/device_team.cpp), a device process's or the thread driver's,
// driven with made-up command timings: this binary is the "kernel library"
// whose hint it takes.
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

  SpinWindow& spin() { return spin_; }
  uint64_t now() const { return now_; }

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

TEST(TeamSpinTest, APauseOfTheDeviceKeepsTheChoice) {
  take_hint_from_this_binary(nullptr);
  Device device;
  for (int i = 0; i < 3; ++i) {
    device.window(0.9, 1.0);
  }
  ASSERT_EQ(g_hints, std::vector<int>({0}));
  // The host sleeps for two windows, then queues a block of 20 busy
  // milliseconds and waits: the window that held the pause called this
  // host-bound before, and the block ran on the short spin.
  SpinWindow& window = device.spin();
  uint64_t now = device.now() + 2 * kSpinWindowNs;
  for (int i = 0; i < 20; ++i) {
    window.ran(now, now + kMs * 9 / 10, true);
    now += kMs;
  }
  EXPECT_EQ(g_hints, std::vector<int>({0}));
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

TEST(TeamSpinTest, TheWorkersOfAllStreamsShareOneWindow) {
  take_hint_from_this_binary(nullptr);
  SpinWindow window;
  // A default stream busy 0.9 of each millisecond, the host waiting behind
  // it, and a copy stream that runs 50 us every 10 ms while the host runs:
  // device-bound together. In windows of its own, the copy stream's busy
  // share (0.005) called for the short spin at each of its commands.
  uint64_t now = 1'000 * kMs;
  for (uint64_t ms = 0; ms < 3 * kSpinWindowNs / kMs; ++ms) {
    window.ran(now + kMs / 10, now + kMs, true);
    if (ms % 10 == 5) {
      window.ran(now, now + kMs / 20, false);
    }
    now += kMs;
  }
  EXPECT_EQ(g_hints, std::vector<int>({0}));
}

TEST(TeamSpinTest, AnIdleWindowSetsTheLongSpinBack) {
  // The thread driver's host shares the choice: once no device has run a
  // command for a window, its own CPU work gets libgomp's default back.
  take_hint_from_this_binary(nullptr);
  SpinWindow window;
  uint64_t now = 1'000 * kMs;
  for (uint64_t ms = 0; ms < 2 * kSpinWindowNs / kMs; ++ms) {
    window.ran(now, now + kMs / 10, false);  // the host runs, the device idles
    now += kMs;
  }
  ASSERT_EQ(g_hints, std::vector<int>({1}));
  ASSERT_TRUE(team_spin_short());
  // Less than a window since the last command: the short spin stays.
  window.idle(now + kSpinWindowNs / 2);
  EXPECT_EQ(g_hints, std::vector<int>({1}));
  // A window without one: long.
  now += kSpinWindowNs;
  window.idle(now);
  EXPECT_EQ(g_hints, std::vector<int>({1, 0}));
  EXPECT_FALSE(team_spin_short());
  // The next window starts at the next command, not at the last one before
  // the idle stretch: one more host-bound window, and short again.
  now += 5 * kSpinWindowNs;
  for (uint64_t ms = 0; ms <= kSpinWindowNs / kMs; ++ms) {
    window.ran(now, now + kMs / 10, false);
    now += kMs;
  }
  EXPECT_EQ(g_hints, std::vector<int>({1, 0, 1}));
}

}  // namespace
}  // namespace openreg_device
