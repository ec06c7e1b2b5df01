// Process-level behaviour: the diagnostic printed when host code touches
// device memory, and the fork guard.
//
// Death tests use the "threadsafe" style: the child re-executes this binary
// and runs only the test at hand, so it starts with a fresh runtime and no
// stream worker threads inherited from the parent.
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "test_util.h"

namespace {

using openreg_test::DeviceCount;

class FaultDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Allocates on `device` and reads (or writes) the device pointer from host
// code, which must kill the process.
void TouchDeviceMemory(int device, size_t offset, bool write) {
  if (orSetDevice(device) != orSuccess) return;
  void* p = nullptr;
  if (orMalloc(&p, 4096) != orSuccess) return;
  volatile char* bytes = static_cast<volatile char*>(p) + offset;
  if (write) {
    *bytes = 1;
  } else {
    char c = *bytes;
    (void)c;
  }
  std::fprintf(stderr, "survived the access\n");
}

TEST_F(FaultDeathTest, HostReadOfDevicePointerDies) {
  EXPECT_DEATH(TouchDeviceMemory(0, 0, false),
               "host code accessed device memory at 0x[0-9a-f]+ \\(device 0, "
               "offset 0x[0-9a-f]+\\)");
}

TEST_F(FaultDeathTest, HostWriteOfDevicePointerDies) {
  EXPECT_DEATH(TouchDeviceMemory(0, 100, true),
               "host code accessed device memory.*device 0");
}

TEST_F(FaultDeathTest, MessageExplainsWhatToDo) {
  EXPECT_DEATH(TouchDeviceMemory(0, 0, false),
               "cannot be read or written by the host");
}

TEST_F(FaultDeathTest, MessageNamesTheOwningDevice) {
  OR_REQUIRE_DEVICES(2);
  EXPECT_DEATH(TouchDeviceMemory(1, 8, false),
               "host code accessed device memory at 0x[0-9a-f]+ \\(device 1, "
               "offset 0x[0-9a-f]+\\)");
}

// ---------------------------------------------------------------------------
// fork()

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

TEST_F(ForkTest, OrdinaryCrashIsNotBlamedOnTheDevice) {
  // A crash outside device memory still kills the process, but the handler
  // must not report it as a device-memory access. The crashing child
  // inherits the parent's (installed) handler; its stderr goes to a pipe.
  ASSERT_GE(DeviceCount(), 1);
  void* guard =
      mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, guard);
  int fds[2];
  ASSERT_EQ(0, pipe(fds));
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    const char msg[] = "about to crash\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    *static_cast<volatile int*>(guard) = 1;
    _exit(0);
  }
  ASSERT_GT(pid, 0);
  close(fds[1]);
  std::string output;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) {
    output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  munmap(guard, 4096);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child survived the access";
  EXPECT_NE(std::string::npos, output.find("about to crash")) << output;
  EXPECT_EQ(std::string::npos, output.find("device memory")) << output;
}

class ForkDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

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
