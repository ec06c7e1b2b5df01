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

}  // namespace
}  // namespace openreg_test
