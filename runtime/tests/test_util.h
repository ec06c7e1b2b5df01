// Helpers shared by the runtime tests. Only the public header is used: the
// tests exercise the C ABI exactly as a client would.
#pragma once

#include <gtest/gtest.h>
#include <openreg.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <ostream>
#include <thread>
#include <vector>

// Makes gtest print "orErrorNotReady (7)" instead of a bare number.
inline void PrintTo(orError_t err, std::ostream* os) {
  *os << orGetErrorName(err) << " (" << static_cast<int>(err) << ")";
}

#define OR_ASSERT_OK(expr) ASSERT_EQ(orSuccess, (expr))
#define OR_EXPECT_OK(expr) EXPECT_EQ(orSuccess, (expr))

namespace openreg_test {

inline int DeviceCount() {
  int count = 0;
  EXPECT_EQ(orSuccess, orGetDeviceCount(&count));
  return count;
}

inline size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// n bytes of a pattern that differs with `seed` and does not repeat with
// any short period, so a copy from the wrong offset shows.
inline std::vector<unsigned char> BytePattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  }
  return v;
}

// Skips the current test unless at least `n` devices exist.
#define OR_REQUIRE_DEVICES(n)                             \
  do {                                                    \
    if (::openreg_test::DeviceCount() < (n)) {            \
      GTEST_SKIP() << "needs " << (n) << " devices (set " \
                   << "OPENREG_DEVICE_COUNT)";            \
    }                                                     \
  } while (0)

inline int NoOpKernel(void*) { return 0; }

// Skips the current test if the driver cannot launch host functions
// (orLaunchKernel): a driver whose devices run in another address space,
// such as OPENREG_DRIVER=process, runs named kernels only.
#define OR_REQUIRE_HOST_KERNELS()                                        \
  do {                                                                   \
    if (orLaunchKernel(nullptr, &::openreg_test::NoOpKernel, nullptr) == \
        orErrorNotSupported) {                                           \
      GTEST_SKIP() << "the driver runs named kernels only "              \
                   << "(orLaunchKernel: orErrorNotSupported)";           \
    }                                                                    \
  } while (0)

// Skips the current test if the driver does not implement IPC.
#define OR_REQUIRE_IPC()                                              \
  do {                                                                \
    orIpcMemHandle_t probe_;                                          \
    if (orIpcGetMemHandle(&probe_, nullptr) == orErrorNotSupported) { \
      GTEST_SKIP() << "the driver does not implement IPC "            \
                   << "(orIpcGetMemHandle: orErrorNotSupported)";     \
    }                                                                 \
  } while (0)

// Every test starts and ends on device 0 so that tests sharing one process
// (a plain run of the binary, as opposed to ctest) do not leak state.
class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(orSuccess, orSetDevice(0)); }
  void TearDown() override {
    EXPECT_EQ(orSuccess, orSetDevice(0));
    // No test may leave an unreported kernel failure behind.
    EXPECT_EQ(orSuccess, orDeviceSynchronize());
  }
};

// A one-shot gate a kernel can block on, so tests can observe "work still
// running" without timing assumptions.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Called by the kernel: announces that it runs, then blocks until Open().
  void Pass() {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
  }
  // Called by the test: blocks until a kernel is inside Pass().
  void WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return entered_; });
  }

  // orKernelFn that blocks on the Gate passed as user_data.
  static int Kernel(void* gate) {
    static_cast<Gate*>(gate)->Pass();
    return 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  bool entered_ = false;
};

// Owns a device allocation for the duration of a scope.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t size) {
    EXPECT_EQ(orSuccess, orMalloc(&ptr_, size));
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      EXPECT_EQ(orSuccess, orFree(ptr_));
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Owns a stream of the current device.
class StreamHandle {
 public:
  StreamHandle() { EXPECT_EQ(orSuccess, orStreamCreate(&stream_)); }
  ~StreamHandle() {
    if (stream_ != nullptr) {
      EXPECT_EQ(orSuccess, orStreamDestroy(stream_));
    }
  }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  orStream_t get() const { return stream_; }

 private:
  orStream_t stream_ = nullptr;
};

// Owns an event of the current device.
class EventHandle {
 public:
  explicit EventHandle(unsigned int flags = orEventDefault) {
    EXPECT_EQ(orSuccess, orEventCreateWithFlags(&event_, flags));
  }
  ~EventHandle() {
    if (event_ != nullptr) {
      EXPECT_EQ(orSuccess, orEventDestroy(event_));
    }
  }
  EventHandle(const EventHandle&) = delete;
  EventHandle& operator=(const EventHandle&) = delete;
  orEvent_t get() const { return event_; }

 private:
  orEvent_t event_ = nullptr;
};

// orKernelFn that sleeps for *static_cast<int*>(ms) milliseconds.
inline int SleepKernel(void* ms) {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(*static_cast<int*>(ms)));
  return 0;
}

inline int FailingKernel(void*) { return 1; }

}  // namespace openreg_test
