// Contract: fork. After the runtime has been initialised, a forked child
// cannot use it (every call returns orErrorInitializedInParent, handles of
// the parent included); orGetDeviceCount only reads the configuration, so a
// process may call it and fork usable children.
//
// Death tests use the "threadsafe" style: the child re-executes this binary
// (with the same driver) and runs only the test at hand, so it starts with a
// runtime nobody has initialised.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "test_util.h"

namespace {

using openreg_test::DeviceCount;

// Runs `child` in a forked child and returns its exit code (or -1 when it did
// not exit normally).
template <typename Fn>
int RunInChild(Fn child) {
  pid_t pid = fork();
  if (pid == 0) {
    _exit(child());
  }
  if (pid < 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ForkTest : public openreg_test::RuntimeTest {};

class ForkDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(ForkTest, ChildOfInitialisedParentGetsInitializedInParent) {
  OR_ASSERT_OK(orInit());
  int code = RunInChild([] {
    int count = -1;
    return static_cast<int>(orGetDeviceCount(&count));
  });
  EXPECT_EQ(static_cast<int>(orErrorInitializedInParent), code);
}

TEST_F(ForkTest, EveryCallInTheChildFails) {
  // Handles made by the parent are no use in the child either.
  orStream_t stream = nullptr;
  OR_ASSERT_OK(orStreamCreate(&stream));
  orEvent_t event = nullptr;
  OR_ASSERT_OK(orEventCreate(&event));
  void* dev = nullptr;
  OR_ASSERT_OK(orMalloc(&dev, 512));

  // The child exits with 0 when every call reported the fork, otherwise
  // with the 1-based index of the first call that did not.
  int code = RunInChild([&] {
    const orError_t want = orErrorInitializedInParent;
    int count = -1;
    int device = -1;
    void* p = nullptr;
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    orDeviceProp prop;
    orPointerAttributes attr;
    orStream_t s = nullptr;
    orEvent_t e = nullptr;
    char host[16] = {};
    const orError_t results[] = {
        orGetDeviceCount(&count),
        orInit(),
        orSetDevice(0),
        orGetDevice(&device),
        orGetDeviceProperties(&prop, 0),
        orMemGetInfo(&free_bytes, &total_bytes),
        orDeviceSynchronize(),
        orMalloc(&p, 512),
        orFree(dev),
        orMallocHost(&p, 512),
        orPointerGetAttributes(&attr, dev),
        orMemcpy(host, dev, sizeof(host), orMemcpyDeviceToHost),
        orMemset(dev, 0, 16),
        orGetKernelPointer(&p, dev),
        orStreamCreate(&s),
        orStreamSynchronize(stream),
        orStreamQuery(nullptr),
        orLaunchKernel(stream, openreg_test::FailingKernel, nullptr),
        orEventCreate(&e),
        orEventRecord(event, stream),
        orEventSynchronize(event),
        orStreamDestroy(stream),
        orEventDestroy(event),
    };
    for (size_t i = 0; i < sizeof(results) / sizeof(results[0]); ++i) {
      if (results[i] != want) {
        std::fprintf(stderr, "call %zu returned %s\n", i + 1,
                     orGetErrorName(results[i]));
        return static_cast<int>(i + 1);
      }
    }
    if (count != 0) return 100;  // out-parameter cleared
    return 0;
  });
  EXPECT_EQ(0, code);

  // The parent is unaffected.
  OR_EXPECT_OK(orStreamDestroy(stream));
  OR_EXPECT_OK(orEventDestroy(event));
  OR_EXPECT_OK(orFree(dev));
  EXPECT_GE(DeviceCount(), 1);
}

TEST_F(ForkDeathTest, ForkBeforeInitialisationLeavesChildUsable) {
  // Runs in a fresh process in which the runtime was never initialised.
  EXPECT_EXIT(
      {
        int code = RunInChild([] {
          int count = -1;
          void* p = nullptr;
          if (orGetDeviceCount(&count) != orSuccess || count < 1) return 1;
          if (orMalloc(&p, 512) != orSuccess || orFree(p) != orSuccess) {
            return 2;
          }
          return 0;
        });
        int count = -1;
        orError_t parent = orGetDeviceCount(&count);
        std::fprintf(stderr, "[child=%d parent=%s]\n", code,
                     orGetErrorName(parent));
        std::fflush(stderr);
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "\\[child=0 parent=orSuccess\\]");
}

TEST_F(ForkDeathTest, DeviceCountBeforeForkLeavesChildUsable) {
  // orGetDeviceCount only reads the configuration, so a process may ask for
  // it and still fork usable children; after orInit it may not.
  EXPECT_EXIT(
      {
        int count = -1;
        orError_t count_err = orGetDeviceCount(&count);
        auto use_runtime = [] {
          void* p = nullptr;
          orError_t err = orMalloc(&p, 512);
          if (err == orSuccess) err = orFree(p);
          return static_cast<int>(err);
        };
        int before = RunInChild(use_runtime);
        orError_t init_err = orInit();
        int after = RunInChild(use_runtime);
        std::fprintf(stderr, "[count=%s before=%s init=%s after=%s]\n",
                     orGetErrorName(count_err),
                     orGetErrorName(static_cast<orError_t>(before)),
                     orGetErrorName(init_err),
                     orGetErrorName(static_cast<orError_t>(after)));
        std::fflush(stderr);
        _exit(0);
      },
      ::testing::ExitedWithCode(0),
      "\\[count=orSuccess before=orSuccess init=orSuccess "
      "after=orErrorInitializedInParent\\]");
}

}  // namespace
