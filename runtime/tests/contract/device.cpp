// Contract: device management — count, current device (per thread),
// properties, memory info, error strings, version. What any driver behind
// runtime/include/openreg.h must do; the simulator's own facts (two devices
// by default, the environment variables) are in ../simulator/device.cpp.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "test_util.h"

namespace {

using openreg_test::DeviceBuffer;
using openreg_test::DeviceCount;
using openreg_test::RuntimeTest;

class DeviceTest : public RuntimeTest {};

TEST_F(DeviceTest, CountIsPositive) {
  int count = -1;
  OR_ASSERT_OK(orGetDeviceCount(&count));
  EXPECT_GE(count, 1);
}

TEST_F(DeviceTest, SetAndGetEveryDevice) {
  const int count = DeviceCount();
  for (int d = 0; d < count; ++d) {
    OR_ASSERT_OK(orSetDevice(d));
    int current = -1;
    OR_ASSERT_OK(orGetDevice(&current));
    EXPECT_EQ(d, current);
  }
  OR_ASSERT_OK(orSetDevice(0));
  int current = -1;
  OR_ASSERT_OK(orGetDevice(&current));
  EXPECT_EQ(0, current);
}

TEST_F(DeviceTest, CurrentDeviceIsThreadLocal) {
  OR_REQUIRE_DEVICES(2);
  OR_ASSERT_OK(orSetDevice(1));

  int seen_by_thread = -1;
  orError_t get_err = orErrorNotReady;
  orError_t set_err = orErrorNotReady;
  int after_set = -1;
  std::thread t([&] {
    // A new thread starts on device 0 whatever its creator selected.
    get_err = orGetDevice(&seen_by_thread);
    set_err = orSetDevice(1);
    orGetDevice(&after_set);
    orSetDevice(0);  // must not leak into the main thread
  });
  t.join();
  EXPECT_EQ(orSuccess, get_err);
  EXPECT_EQ(0, seen_by_thread);
  EXPECT_EQ(orSuccess, set_err);
  EXPECT_EQ(1, after_set);

  int current = -1;
  OR_ASSERT_OK(orGetDevice(&current));
  EXPECT_EQ(1, current);
}

TEST_F(DeviceTest, InvalidOrdinalsAreRejectedAndKeepCurrentDevice) {
  const int count = DeviceCount();
  OR_ASSERT_OK(orSetDevice(count - 1));
  for (int bad : {-1, count, count + 1, INT_MAX, INT_MIN}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(orErrorInvalidDevice, orSetDevice(bad));
    int current = -1;
    OR_ASSERT_OK(orGetDevice(&current));
    EXPECT_EQ(count - 1, current);

    orDeviceProp prop;
    EXPECT_EQ(orErrorInvalidDevice, orGetDeviceProperties(&prop, bad));

    orStream_t stream = reinterpret_cast<orStream_t>(0x1);
    EXPECT_EQ(orErrorInvalidDevice, orDeviceGetDefaultStream(bad, &stream));
    EXPECT_EQ(nullptr, stream);
  }
}

TEST_F(DeviceTest, NullOutParametersAreInvalidValue) {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  int value = 0;
  EXPECT_EQ(orErrorInvalidValue, orGetDeviceCount(nullptr));
  EXPECT_EQ(orErrorInvalidValue, orGetDevice(nullptr));
  EXPECT_EQ(orErrorInvalidValue, orGetDeviceProperties(nullptr, 0));
  EXPECT_EQ(orErrorInvalidValue, orMemGetInfo(nullptr, &total_bytes));
  EXPECT_EQ(orErrorInvalidValue, orMemGetInfo(&free_bytes, nullptr));
  EXPECT_EQ(orErrorInvalidValue, orMemGetInfo(nullptr, nullptr));
  EXPECT_EQ(orErrorInvalidValue,
            orDeviceGetStreamPriorityRange(nullptr, &value));
  EXPECT_EQ(orErrorInvalidValue,
            orDeviceGetStreamPriorityRange(&value, nullptr));
  EXPECT_EQ(orErrorInvalidValue, orRuntimeGetVersion(nullptr));
  EXPECT_EQ(orErrorInvalidValue, orDeviceGetDefaultStream(0, nullptr));
}

TEST_F(DeviceTest, Properties) {
  const int count = DeviceCount();
  int least = 1234;
  int greatest = 1234;
  OR_ASSERT_OK(orDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT_LE(greatest, least);  // lower number = higher priority

  for (int d = 0; d < count; ++d) {
    SCOPED_TRACE(d);
    orDeviceProp prop;
    std::memset(&prop, 0xff, sizeof(prop));
    OR_ASSERT_OK(orGetDeviceProperties(&prop, d));
    const size_t name_len = strnlen(prop.name, sizeof(prop.name));
    EXPECT_GT(name_len, 0u);
    EXPECT_LT(name_len, sizeof(prop.name));  // NUL-terminated
    EXPECT_GT(prop.totalGlobalMem, 0u);
    EXPECT_GE(prop.major, 0);
    EXPECT_GE(prop.minor, 0);
    EXPECT_GE(prop.multiProcessorCount, 1);
    EXPECT_EQ(least, prop.streamPriorityLeast);
    EXPECT_EQ(greatest, prop.streamPriorityGreatest);

    // orMemGetInfo reports the same capacity for the current device.
    OR_ASSERT_OK(orSetDevice(d));
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    OR_ASSERT_OK(orMemGetInfo(&free_bytes, &total_bytes));
    EXPECT_EQ(prop.totalGlobalMem, total_bytes);
    EXPECT_LE(free_bytes, total_bytes);
  }
}

TEST_F(DeviceTest, AllocationReducesFreeMemoryUntilFreed) {
  size_t free0 = 0;
  size_t total0 = 0;
  OR_ASSERT_OK(orMemGetInfo(&free0, &total0));
  for (size_t request : {size_t{1}, size_t{513}, size_t{1} << 20}) {
    SCOPED_TRACE(request);
    void* p = nullptr;
    OR_ASSERT_OK(orMalloc(&p, request));
    size_t free1 = 0;
    size_t total1 = 0;
    OR_ASSERT_OK(orMemGetInfo(&free1, &total1));
    EXPECT_EQ(total0, total1);
    EXPECT_LE(free1 + request, free0);
    OR_ASSERT_OK(orFree(p));
    OR_ASSERT_OK(orMemGetInfo(&free1, &total1));
    EXPECT_EQ(free0, free1);
  }
}

TEST_F(DeviceTest, MemGetInfoIsPerDevice) {
  OR_REQUIRE_DEVICES(2);
  size_t free0 = 0;
  size_t total = 0;
  OR_ASSERT_OK(orMemGetInfo(&free0, &total));

  OR_ASSERT_OK(orSetDevice(1));
  size_t free1 = 0;
  OR_ASSERT_OK(orMemGetInfo(&free1, &total));
  {
    DeviceBuffer on_device1(1 << 20);
    ASSERT_NE(nullptr, on_device1.get());
    size_t now = 0;
    OR_ASSERT_OK(orMemGetInfo(&now, &total));
    EXPECT_LE(now + (1 << 20), free1);

    OR_ASSERT_OK(orSetDevice(0));
    OR_ASSERT_OK(orMemGetInfo(&now, &total));
    EXPECT_EQ(free0, now);  // device 0 is untouched
    // on_device1 is freed while device 0 is current: orFree works on any
    // device's allocation.
  }
  OR_ASSERT_OK(orSetDevice(1));
  size_t after = 0;
  OR_ASSERT_OK(orMemGetInfo(&after, &total));
  EXPECT_EQ(free1, after);
}

TEST(ErrorStringTest, EveryCodeHasItsNameAndADistinctDescription) {
  struct Expected {
    orError_t code;
    int value;
    const char* name;
  };
  // The numeric values are ABI: check them here too.
  const Expected kAll[] = {
      {orSuccess, 0, "orSuccess"},
      {orErrorInvalidValue, 1, "orErrorInvalidValue"},
      {orErrorMemoryAllocation, 2, "orErrorMemoryAllocation"},
      {orErrorInitializationError, 3, "orErrorInitializationError"},
      {orErrorInvalidDevice, 4, "orErrorInvalidDevice"},
      {orErrorInvalidDevicePointer, 5, "orErrorInvalidDevicePointer"},
      {orErrorInvalidMemcpyDirection, 6, "orErrorInvalidMemcpyDirection"},
      {orErrorNotReady, 7, "orErrorNotReady"},
      {orErrorInvalidResourceHandle, 8, "orErrorInvalidResourceHandle"},
      {orErrorLaunchFailure, 9, "orErrorLaunchFailure"},
      {orErrorInitializedInParent, 10, "orErrorInitializedInParent"},
      {orErrorInvalidEventTiming, 11, "orErrorInvalidEventTiming"},
      {orErrorInvalidHostPointer, 12, "orErrorInvalidHostPointer"},
      {orErrorIpcSameProcess, 13, "orErrorIpcSameProcess"},
      {orErrorMapBufferObjectFailed, 14, "orErrorMapBufferObjectFailed"},
      {orErrorDeviceLost, 15, "orErrorDeviceLost"},
      {orErrorFileNotFound, 16, "orErrorFileNotFound"},
      {orErrorSymbolNotFound, 17, "orErrorSymbolNotFound"},
      {orErrorNotSupported, 18, "orErrorNotSupported"},
      {orErrorInterrupted, 19, "orErrorInterrupted"},
  };
  std::set<std::string> descriptions;
  for (const Expected& e : kAll) {
    SCOPED_TRACE(e.name);
    EXPECT_EQ(e.value, static_cast<int>(e.code));
    const char* name = orGetErrorName(e.code);
    const char* text = orGetErrorString(e.code);
    ASSERT_NE(nullptr, name);
    ASSERT_NE(nullptr, text);
    EXPECT_STREQ(e.name, name);
    EXPECT_GT(std::strlen(text), 0u);
    EXPECT_STRNE("unrecognized error code", text);
    EXPECT_TRUE(descriptions.insert(text).second) << "duplicate: " << text;
  }
  EXPECT_STREQ("no error", orGetErrorString(orSuccess));
  EXPECT_STREQ("out of memory", orGetErrorString(orErrorMemoryAllocation));
}

TEST(ErrorStringTest, UnknownCodes) {
  // The value a C++ caller can form without UB (the enum's range is 0..31);
  // the lookup treats any other int the same way.
  for (int code : {20, 31}) {
    SCOPED_TRACE(code);
    auto err = static_cast<orError_t>(code);
    ASSERT_NE(nullptr, orGetErrorString(err));
    ASSERT_NE(nullptr, orGetErrorName(err));
    EXPECT_STREQ("unrecognized error code", orGetErrorString(err));
    EXPECT_STREQ("unrecognized error code", orGetErrorName(err));
  }
}

TEST_F(DeviceTest, InitIsIdempotent) {
  OR_EXPECT_OK(orInit());
  OR_EXPECT_OK(orInit());
  int count = 0;
  OR_EXPECT_OK(orGetDeviceCount(&count));
  EXPECT_GE(count, 1);
}

TEST(VersionTest, RuntimeVersion) {
  int version = -1;
  OR_ASSERT_OK(orRuntimeGetVersion(&version));
  EXPECT_GE(version, 1000);    // major >= 1
  EXPECT_EQ(0, version % 10);  // major * 1000 + minor * 10
}

}  // namespace
