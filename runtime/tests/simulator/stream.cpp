// The simulator's stream workers: when an idle worker thread ends
// (stream.cpp, run()). A worker that may have opened a thread pool for its
// kernels retires after 10 ms without work; one that ran only kernels
// launched with hostThreads == 1 sleeps until the next launch. A driver for
// real hardware has no workers (the contract is in ../contract/).
#include <atomic>
#include <chrono>
#include <thread>

#include "test_util.h"

namespace {

using openreg_test::RuntimeTest;
using openreg_test::StreamHandle;

class SimulatedStreamTest : public RuntimeTest {};

// A number for the thread that runs it, never given to another thread.
int ThreadSerial(void* out) {
  static std::atomic<int> next{1};
  thread_local const int serial = next.fetch_add(1);
  *static_cast<int*>(out) = serial;
  return 0;
}

// Launches two kernels with `attrs` on a new stream, 100 ms apart (ten
// times the retire delay): whether the same thread ran both.
bool WorkerSurvivesIdle(const orLaunchAttributes* attrs) {
  StreamHandle stream;
  int first = 0;
  int second = 0;
  EXPECT_EQ(orSuccess,
            orLaunchKernelEx(stream.get(), ThreadSerial, &first, attrs));
  EXPECT_EQ(orSuccess, orStreamSynchronize(stream.get()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(orSuccess,
            orLaunchKernelEx(stream.get(), ThreadSerial, &second, attrs));
  EXPECT_EQ(orSuccess, orStreamSynchronize(stream.get()));
  EXPECT_NE(0, first);
  EXPECT_NE(0, second);
  return first == second;
}

TEST_F(SimulatedStreamTest, WorkerOfSingleThreadKernelsKeepsItsThread) {
  orLaunchAttributes one{};
  one.hostThreads = 1;
  EXPECT_TRUE(WorkerSurvivesIdle(&one));
}

TEST_F(SimulatedStreamTest, WorkerThatMayHoldAPoolRetiresWhenIdle) {
  orLaunchAttributes unknown{};  // hostThreads 0: not known
  EXPECT_FALSE(WorkerSurvivesIdle(&unknown));
  EXPECT_FALSE(WorkerSurvivesIdle(nullptr));  // the defaults
  orLaunchAttributes four{};
  four.hostThreads = 4;
  EXPECT_FALSE(WorkerSurvivesIdle(&four));
}

// One kernel that may hold threads is enough: the worker retires.
TEST_F(SimulatedStreamTest, OneMultiThreadKernelMakesTheWorkerRetire) {
  StreamHandle stream;
  orLaunchAttributes one{};
  one.hostThreads = 1;
  int first = 0;
  int unused = 0;
  int second = 0;
  OR_ASSERT_OK(orLaunchKernelEx(stream.get(), ThreadSerial, &first, &one));
  OR_ASSERT_OK(orLaunchKernel(stream.get(), ThreadSerial, &unused));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  OR_ASSERT_OK(orLaunchKernelEx(stream.get(), ThreadSerial, &second, &one));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  EXPECT_EQ(first, unused);
  EXPECT_NE(first, second);
}

}  // namespace
