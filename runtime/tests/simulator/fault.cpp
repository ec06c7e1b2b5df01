// The simulator's fault handler: host code that touches device memory dies
// with a diagnostic naming the device and offset; any other crash is not
// blamed on the device. (A real device faults differently or not at all;
// the fork guard every driver must have is in ../contract/fork.cpp.)
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
// Crashes that are not device-memory accesses

class FaultTest : public openreg_test::RuntimeTest {};

TEST_F(FaultTest, OrdinaryCrashIsNotBlamedOnTheDevice) {
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

}  // namespace
