// The simulator's orKernelContext::team_threads (module.cpp): the device
// computes on the host's cores, so while no host thread waits for it, a
// kernel that may run on fewer threads leaves the host one of them. A driver
// for real hardware answers the threads asked for (the contract is in
// ../contract/module.cpp).
//
// Built twice: into openreg_runtime_tests (the thread driver) and into
// openreg_process_tests (the process driver: a device process reads the
// user process's waiting threads in its control block, device_main.cpp).
#include <atomic>
#include <chrono>
#include <thread>

#include "contract/module_fixture.h"
#include "kernels/test_kernels.h"
#include "test_util.h"

namespace openreg_test {
namespace {

// The answer to team_threads(threads) of a kernel that asks at once, read
// from pinned memory: the host never waits in the driver meanwhile.
uint32_t AnswerWhileTheHostRuns(ModuleTest* test, uint32_t threads) {
  PinnedWords result(1);
  EXPECT_EQ(orSuccess,
            test->Launch(nullptr, "or_test_team_threads",
                         OrTestTeamThreads{result.address(0), threads, 0}));
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (result[0] == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  const uint32_t answer = result[0];
  EXPECT_EQ(orSuccess, orDeviceSynchronize());
  return answer;
}

TEST_F(ModuleTest, TeamThreadsLeaveARunningHostOneThread) {
  EXPECT_EQ(3u, AnswerWhileTheHostRuns(this, 4));
  EXPECT_EQ(1u, AnswerWhileTheHostRuns(this, 2));
  EXPECT_EQ(1u, AnswerWhileTheHostRuns(this, 1));
}

TEST_F(ModuleTest, TeamThreadsAreAllWhileAnyHostThreadWaits) {
  // One host thread waits for a stream that a gate holds; the kernel asks
  // on another stream, until it gets all four.
  StreamHandle held;
  PinnedWords result(1);
  std::atomic<bool> waited{false};
  {
    GateLaunch gate(this, held.get());
    std::thread waiter([&] {
      EXPECT_EQ(orSuccess, orStreamSynchronize(held.get()));
      waited = true;
    });
    StreamHandle other;
    OR_ASSERT_OK(Launch(other.get(), "or_test_team_threads",
                        OrTestTeamThreads{result.address(0), 4, 1}));
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (result[0] == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    EXPECT_EQ(4u, result[0]);
    EXPECT_FALSE(waited.load());
    gate.Open();
    waiter.join();
  }
  OR_EXPECT_OK(orDeviceSynchronize());
}

}  // namespace
}  // namespace openreg_test
