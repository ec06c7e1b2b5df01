// Contract: a launch queue the host fills faster than the device drains it.
// A launch may block for room (CUDA's launch queue is bounded too), but no
// work is lost or reordered, and host threads that synchronize at different
// points each return once the work launched before their call has finished,
// with either driver (named kernels only).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "contract/module_fixture.h"
#include "kernels/test_kernels.h"
#include "test_util.h"

namespace openreg_test {
namespace {

// Launch i adds to word i / kGroup: w = w * 2 + (i % kGroup + 1). The kGroup
// launches of a word fit its 32 bits, so its final value spells their order.
constexpr int kGroup = 16;
constexpr int kSteps = 3000;  // more than either driver's queue holds

uint32_t GroupValue(int launches) {
  uint32_t w = 0;
  for (int i = 0; i < launches; ++i) {
    w = w * 2 + static_cast<uint32_t>(i % kGroup + 1);
  }
  return w;
}

TEST_F(ModuleTest, HostFarAheadOfABlockedStreamLosesAndReordersNothing) {
  constexpr int kWords = (kSteps + kGroup - 1) / kGroup;
  PinnedWords words(kWords);
  StreamHandle stream;
  std::vector<std::thread> waiters;
  std::vector<int> wrong(6, 0);
  const int waiter_at[6] = {10, 40, 60, 500, 1500, 2500};
  {
    GateLaunch gate(this, stream.get());
    std::thread opener([&] {
      gate.WaitEntered();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      gate.Open();
    });
    int next_waiter = 0;
    for (int i = 0; i < kSteps; ++i) {
      if (next_waiter < 6 && i == waiter_at[next_waiter]) {
        // Work launched so far: the groups below i / kGroup are complete
        // once this thread's synchronization returns.
        const int k = next_waiter++;
        waiters.emplace_back([&, k, launched = i] {
          if (orStreamSynchronize(stream.get()) != orSuccess) {
            wrong[k] = -1;
            return;
          }
          for (int g = 0; g < launched / kGroup; ++g) {
            if (words[g] != GroupValue(kGroup)) {
              ++wrong[k];
            }
          }
        });
      }
      OrTestFill p{words.address(i / kGroup), 1,
                   static_cast<uint32_t>(i % kGroup + 1), 0};
      if (Launch(stream.get(), "or_test_scale_add_u32", p) != orSuccess) {
        ADD_FAILURE() << "launch " << i << " failed";
        break;  // the waiters and the opener still end
      }
    }
    opener.join();
  }  // the gate's end synchronizes the stream
  for (auto& t : waiters) {
    t.join();
  }
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(0, wrong[k]) << "the waiter that synchronized after launch "
                           << waiter_at[k];
  }
  for (int g = 0; g < kWords; ++g) {
    const int launches = std::min(kGroup, kSteps - g * kGroup);
    ASSERT_EQ(GroupValue(launches), words[g]) << "word " << g;
  }
}

// A host that launches faster than the device runs fills the queue, waits
// for room, and fills it again: after its first wait it runs as far ahead as
// before it (a CUDA launch queue's depth stays the depth), not a fraction of
// the queue behind it with a wait at every launch. Each kernel notes how far
// ahead the host is when it starts; the farthest lead in the middle of the
// run is compared with the farthest over its first stretch, which is the
// queue's depth (a driver-specific number this test does not assume).
TEST_F(ModuleTest, HostFarAheadFillsTheQueueAgainAfterWaitingForRoom) {
  constexpr uint32_t kLaunches = 6000;
  PinnedWords launched(1);
  PinnedWords leads(kLaunches);
  StreamHandle stream;
  orFunction_t fn = Function("or_test_note_lead");
  for (uint32_t i = 0; i < kLaunches; ++i) {
    OrTestLead p{launched.address(0), leads.address(0), i, 20};
    ASSERT_EQ(orSuccess,
              orLaunchFunction(stream.get(), fn, &p, sizeof(p), nullptr))
        << "launch " << i;
    launched[0] = i + 1;
  }
  ASSERT_EQ(orSuccess, orStreamSynchronize(stream.get()));
  uint32_t first = 0;
  for (uint32_t i = 0; i < kLaunches / 4; ++i) {
    first = std::max(first, static_cast<uint32_t>(leads[i]));
  }
  uint32_t middle = 0;
  for (uint32_t i = kLaunches / 2; i < kLaunches * 3 / 4; ++i) {
    middle = std::max(middle, static_cast<uint32_t>(leads[i]));
  }
  if (first >= kLaunches / 2) {
    GTEST_SKIP() << "the queue holds " << first << " launches: too deep for "
                 << kLaunches << " to wait for room";
  }
  EXPECT_GE(middle, first * 9 / 10)
      << "the host ran at most " << middle << " launches ahead after waiting "
      << "for room, against " << first << " before";
}

}  // namespace
}  // namespace openreg_test
