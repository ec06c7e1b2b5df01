// The simulator's own facts about devices: two devices of 4 GiB by default,
// both set by environment variables read once per process; every device has
// the same capacity and properties; the driver charges allocations in whole
// 512-byte blocks. A driver for real hardware has its own answers (the
// contract every driver must meet is in ../contract/).
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "test_util.h"

namespace {

using openreg_test::DeviceCount;
using openreg_test::RuntimeTest;

class SimulatedDeviceTest : public RuntimeTest {};

TEST_F(SimulatedDeviceTest, CountDefaultsToTwoAndIsAtMostSixteen) {
  int count = -1;
  OR_ASSERT_OK(orGetDeviceCount(&count));
  EXPECT_LE(count, 16);
  if (std::getenv("OPENREG_DEVICE_COUNT") == nullptr) {
    EXPECT_EQ(2, count);
  }
}

TEST_F(SimulatedDeviceTest, EveryDeviceIsTheSameSimulatedDevice) {
  const int count = DeviceCount();
  size_t first_total = 0;
  for (int d = 0; d < count; ++d) {
    SCOPED_TRACE(d);
    orDeviceProp prop;
    std::memset(&prop, 0xff, sizeof(prop));
    OR_ASSERT_OK(orGetDeviceProperties(&prop, d));
    EXPECT_STREQ("openreg simulated device", prop.name);
    EXPECT_GE(prop.totalGlobalMem, size_t{1} << 20);
    EXPECT_EQ(0u, prop.totalGlobalMem % 512);
    EXPECT_GE(prop.major, 1);
    EXPECT_EQ(d, prop.pciBusID);
    if (d == 0) {
      first_total = prop.totalGlobalMem;
    }
    EXPECT_EQ(first_total, prop.totalGlobalMem);
  }
}

TEST_F(SimulatedDeviceTest, MemGetInfoTracksRoundedAllocationSize) {
  size_t free0 = 0;
  size_t total0 = 0;
  OR_ASSERT_OK(orMemGetInfo(&free0, &total0));

  struct Case {
    size_t request;
    size_t charged;
  };
  for (Case c : {Case{1, 512}, Case{511, 512}, Case{512, 512}, Case{513, 1024},
                 Case{4096, 4096}, Case{100000, 100352}}) {
    SCOPED_TRACE(c.request);
    void* p = nullptr;
    OR_ASSERT_OK(orMalloc(&p, c.request));
    size_t free1 = 0;
    size_t total1 = 0;
    OR_ASSERT_OK(orMemGetInfo(&free1, &total1));
    EXPECT_EQ(total0, total1);
    EXPECT_EQ(free0 - c.charged, free1);

    OR_ASSERT_OK(orFree(p));
    OR_ASSERT_OK(orMemGetInfo(&free1, &total1));
    EXPECT_EQ(free0, free1);
  }
}

// ---------------------------------------------------------------------------
// Initialisation from the environment. The runtime reads its environment
// once per process, so each case runs in a fresh process: a "threadsafe"
// death test re-executes this binary and runs only the statement's test, in
// which nothing has touched the runtime before the statement.

// Sets (or, for nullptr, unsets) the two variables, initialises the runtime
// and reports the outcome on stderr for the parent's regex.
[[noreturn]] void InitWith(const char* count_env, const char* memory_env,
                           size_t address_space_limit = 0) {
  if (address_space_limit != 0) {
    const rlimit limit{address_space_limit, address_space_limit};
    setrlimit(RLIMIT_AS, &limit);
  }
  auto set = [](const char* name, const char* value) {
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  };
  set("OPENREG_DEVICE_COUNT", count_env);
  set("OPENREG_DEVICE_MEMORY", memory_env);
  int count = -1;
  orError_t err = orGetDeviceCount(&count);
  orError_t init_err = orInit();
  orDeviceProp prop;
  std::memset(&prop, 0, sizeof(prop));
  orError_t prop_err = orGetDeviceProperties(&prop, 0);
  void* p = nullptr;
  orError_t malloc_err = orMalloc(&p, 1);
  std::fprintf(stderr,
               "[err=%s count=%d init=%s prop=%s total=%zu malloc=%s]\n",
               orGetErrorName(err), count, orGetErrorName(init_err),
               orGetErrorName(prop_err), prop.totalGlobalMem,
               orGetErrorName(malloc_err));
  std::fflush(stderr);
  _exit(0);
}

class DeviceEnvDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(DeviceEnvDeathTest, DefaultsWithoutVariables) {
  EXPECT_EXIT(InitWith(nullptr, nullptr), ::testing::ExitedWithCode(0),
              "\\[err=orSuccess count=2 init=orSuccess prop=orSuccess "
              "total=4294967296 malloc=orSuccess\\]");
}

TEST_F(DeviceEnvDeathTest, DeviceCountFromEnvironment) {
  EXPECT_EXIT(InitWith("1", nullptr), ::testing::ExitedWithCode(0),
              "\\[err=orSuccess count=1 ");
  EXPECT_EXIT(InitWith("5", nullptr), ::testing::ExitedWithCode(0),
              "\\[err=orSuccess count=5 ");
  EXPECT_EXIT(InitWith("16", nullptr), ::testing::ExitedWithCode(0),
              "\\[err=orSuccess count=16 ");
}

TEST_F(DeviceEnvDeathTest, BadDeviceCountFailsInitialisation) {
  for (const char* bad : {"0", "17", "-1", "two", "2x", "", " 3", "3 ", "+3"}) {
    SCOPED_TRACE(bad);
    // Every later call keeps reporting the failure; count is zeroed.
    EXPECT_EXIT(InitWith(bad, nullptr), ::testing::ExitedWithCode(0),
                "OPENREG_DEVICE_COUNT.*\\[err=orErrorInitializationError "
                "count=0 init=orErrorInitializationError "
                "prop=orErrorInitializationError total=0 "
                "malloc=orErrorInitializationError\\]");
  }
}

TEST_F(DeviceEnvDeathTest, DeviceMemoryFromEnvironment) {
  struct Case {
    const char* text;
    const char* total;
  };
  const long page = sysconf(_SC_PAGESIZE);
  // 1 MiB + 1 byte is rounded up to whole pages.
  const std::string rounded =
      std::to_string((1048577 + page - 1) / page * page);
  for (Case c : {Case{"64M", "67108864"}, Case{"1G", "1073741824"},
                 Case{"1T", "1099511627776"}, Case{"1024G", "1099511627776"},
                 Case{"2048k", "2097152"}, Case{"1MiB", "1048576"},
                 Case{"3GB", "3221225472"}, Case{"1048576", "1048576"},
                 Case{"1048577", rounded.c_str()}}) {
    SCOPED_TRACE(c.text);
    EXPECT_EXIT(
        InitWith(nullptr, c.text), ::testing::ExitedWithCode(0),
        std::string("\\[err=orSuccess count=2 init=orSuccess prop=orSuccess "
                    "total=") +
            c.total + " malloc=orSuccess\\]");
  }
}

TEST_F(DeviceEnvDeathTest, BadDeviceMemoryFailsInitialisation) {
  for (const char* bad :
       {"", "abc", "512K", "1048575", "12T", "1025G", " 1G", "1G ", "4G!",
        "1.5G", "-1", "-1G", "99999999999999999999G", "18446744073709551615"}) {
    SCOPED_TRACE(bad);
    EXPECT_EXIT(InitWith(nullptr, bad), ::testing::ExitedWithCode(0),
                "OPENREG_DEVICE_MEMORY.*\\[err=orErrorInitializationError "
                "count=0 init=orErrorInitializationError ");
  }
}

TEST_F(DeviceEnvDeathTest, DeviceCreationFailureIsReportedByInit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory needs more address space "
                  "than the 2 GiB limit this test sets (its own mmap fails)";
#endif
  // A valid size that no mapping can satisfy (4 GiB per device in a process
  // limited to 2 GiB of address space): the configuration is valid, so
  // orGetDeviceCount (which only reads it) succeeds, but creating the
  // devices fails.
  EXPECT_EXIT(InitWith(nullptr, "4G", size_t{2} << 30),
              ::testing::ExitedWithCode(0),
              "\\[err=orSuccess count=2 init=orErrorInitializationError "
              "prop=orErrorInitializationError total=0 "
              "malloc=orErrorInitializationError\\]");
}

}  // namespace

namespace {

int ReadThreadName(void* out) {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  *static_cast<std::string*>(out) = name;
  return 0;
}

TEST_F(SimulatedDeviceTest, StreamWorkersAreNamedAfterTheirDeviceAndStream) {
  std::string name;
  orStream_t def = nullptr;
  OR_ASSERT_OK(orDeviceGetDefaultStream(0, &def));
  OR_ASSERT_OK(orLaunchKernel(def, ReadThreadName, &name));
  OR_ASSERT_OK(orStreamSynchronize(def));
  EXPECT_EQ("openreg0-dflt", name);

  orStream_t side = nullptr;
  OR_ASSERT_OK(orStreamCreate(&side));
  OR_ASSERT_OK(orLaunchKernel(side, ReadThreadName, &name));
  OR_ASSERT_OK(orStreamSynchronize(side));
  EXPECT_EQ("openreg0-strm", name);
  OR_ASSERT_OK(orStreamDestroy(side));
}

}  // namespace

namespace {

std::atomic<bool> g_started{false};

int SleepThenCount(void* counter) {
  g_started = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ++*static_cast<std::atomic<int>*>(counter);
  return 0;
}

int Count(void* counter) {
  ++*static_cast<std::atomic<int>*>(counter);
  return 0;
}

// orSimulateDeviceLoss: device 1 is lost while a kernel runs and another
// waits; the running one finishes, the waiting one is dropped, every call on
// device 1 fails with orErrorDeviceLost, device 0 keeps working. In a child
// process: a lost device stays lost.
[[noreturn]] void LoseDeviceOne() {
  std::atomic<int> ran{0};
  orSetDevice(1);
  void* before = nullptr;
  orMalloc(&before, 4096);
  orStream_t s = nullptr;
  orStreamCreate(&s);
  orEvent_t e = nullptr;
  orEventCreate(&e);
  orLaunchKernel(s, SleepThenCount, &ran);
  orLaunchKernel(s, Count, &ran);
  orEventRecord(e, s);
  while (!g_started) {
    std::this_thread::yield();  // the first kernel runs when the loss comes
  }
  orError_t lose = orSimulateDeviceLoss(1, "test fault");
  orError_t sync = orStreamSynchronize(s);
  orError_t event_sync = orEventSynchronize(e);
  void* p = nullptr;
  orError_t malloc_err = orMalloc(&p, 4096);
  orError_t launch = orLaunchKernel(s, Count, &ran);
  orError_t device_sync = orDeviceSynchronize();
  char reason[64];
  orError_t query = orDeviceGetLossReason(1, reason, sizeof(reason));
  orError_t free_err = orFree(before);  // its memory is gone: no error
  orSetDevice(0);
  std::atomic<int> ran0{0};
  orError_t launch0 = orLaunchKernel(nullptr, Count, &ran0);
  orError_t sync0 = orDeviceSynchronize();
  char reason0[8];
  orError_t query0 = orDeviceGetLossReason(0, reason0, sizeof(reason0));
  std::fprintf(stderr,
               "[lose=%s sync=%s event=%s malloc=%s launch=%s device=%s "
               "query=%s reason=%s free=%s ran=%d | launch0=%s sync0=%s "
               "query0=%s ran0=%d]\n",
               orGetErrorName(lose), orGetErrorName(sync),
               orGetErrorName(event_sync), orGetErrorName(malloc_err),
               orGetErrorName(launch), orGetErrorName(device_sync),
               orGetErrorName(query), reason, orGetErrorName(free_err),
               ran.load(), orGetErrorName(launch0), orGetErrorName(sync0),
               orGetErrorName(query0), ran0.load());
  std::fflush(stderr);
  _exit(0);
}

TEST_F(DeviceEnvDeathTest, LostDeviceFailsEveryCallAndSparesTheOthers) {
  EXPECT_EXIT(
      LoseDeviceOne(), ::testing::ExitedWithCode(0),
      "\\[lose=orSuccess sync=orErrorDeviceLost event=orErrorDeviceLost "
      "malloc=orErrorDeviceLost launch=orErrorDeviceLost "
      "device=orErrorDeviceLost query=orErrorDeviceLost reason=test fault "
      "free=orSuccess ran=1 \\| launch0=orSuccess sync0=orSuccess "
      "query0=orSuccess ran0=1\\]");
}

}  // namespace
