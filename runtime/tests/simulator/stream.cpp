// The simulator's stream workers: when an idle worker thread ends
// (stream.cpp, run()). A worker that may have opened a thread pool for its
// kernels retires after 10 ms without work; one that ran only kernels
// launched with hostThreads == 1 sleeps until the next launch. A driver for
// real hardware has no workers (the contract is in ../contract/).
#include <atomic>
#include <chrono>
#include <thread>

#include "test_util.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

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

#if defined(__SSE__) || defined(__x86_64__)
// Whether a denormal survives a multiplication on the calling thread.
int KeepsDenormals(void* out) {
  volatile float tiny = 1e-39f;
  volatile float one = 1.0f;
  *static_cast<int*>(out) = (tiny * one) != 0.0f ? 1 : 2;
  return 0;
}

// A device has its own floating-point mode: a host thread that flushes
// denormals (torch.set_flush_denormal) and then starts a stream's worker
// does not pass its mode on.
TEST_F(SimulatedStreamTest, WorkerDoesNotInheritTheHostFloatingPointMode) {
  constexpr unsigned kFlushAndDenormalsAreZero = 0x8040;
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | kFlushAndDenormalsAreZero);
  int host = 0;
  KeepsDenormals(&host);
  int device = 0;
  {
    StreamHandle stream;  // its worker starts now, from this thread
    EXPECT_EQ(orSuccess, orLaunchKernel(stream.get(), KeepsDenormals, &device));
    EXPECT_EQ(orSuccess, orStreamSynchronize(stream.get()));
  }
  _mm_setcsr(saved);
  EXPECT_EQ(2, host);    // this thread flushes
  EXPECT_EQ(1, device);  // the device does not
}
#endif

}  // namespace
