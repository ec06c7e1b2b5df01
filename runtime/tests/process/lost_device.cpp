// The process driver's own facts (OPENREG_DRIVER=process): a device is a
// process, and when it dies the device is lost while the user's process
// and the other devices go on; device processes never outlive the user's.
//
// Each test loses a different device (this binary sets five devices), so
// the tests also pass when run in one process; ctest runs each in its own.
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kernels/test_kernels.h"
#include "test_util.h"

extern char** environ;

namespace openreg_test {
namespace {

// Before the runtime reads its environment.
const bool kConfigured = [] {
  setenv("OPENREG_DRIVER", "process", 1);
  setenv("OPENREG_DEVICE_COUNT", "5", 1);
  setenv("OPENREG_DEVICE_MEMORY", "64M", 1);
  return true;
}();

using Clock = std::chrono::steady_clock;

// Device ordinal -> pid of the device processes whose parent is `parent`.
std::map<int, int> DeviceProcesses(int parent) {
  std::map<int, int> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) {
    return found;
  }
  while (dirent* entry = readdir(proc)) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0) {
      continue;
    }
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) {
      continue;
    }
    // pid (comm) state ppid ...
    const size_t open = line.find('(');
    const size_t close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) {
      continue;
    }
    const std::string comm = line.substr(open + 1, close - open - 1);
    char state = 0;
    int ppid = 0;
    std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid);
    if (ppid == parent && comm.rfind("openreg-dev", 0) == 0) {
      found[std::atoi(comm.c_str() + 11)] = pid;
    }
  }
  closedir(proc);
  return found;
}

// True once `pid` no longer exists (reaped, not a zombie), within 5 s.
bool Vanishes(int pid) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until) {
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::string LossReason(int device) {
  char reason[512] = {};
  orDeviceGetLossReason(device, reason, sizeof(reason));
  return reason;
}

// Waits until `device` is lost (the watcher notices within milliseconds).
bool BecomesLost(int device) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until) {
    if (orDeviceGetLossReason(device, nullptr, 0) == orErrorDeviceLost) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

class ProcessDriverTest : public RuntimeTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kConfigured);
    RuntimeTest::SetUp();
    const char* path = std::getenv("OPENREG_TEST_KERNELS");
    ASSERT_EQ(
        orSuccess,
        orModuleLoad(&module_,
                     path != nullptr ? path : OPENREG_TEST_KERNELS_DEFAULT));
  }
  void TearDown() override {
    EXPECT_EQ(orSuccess, orModuleUnload(module_));
    RuntimeTest::TearDown();  // device 0 synchronizes cleanly
  }
  orFunction_t Function(const char* name) {
    orFunction_t fn = nullptr;
    EXPECT_EQ(orSuccess, orModuleGetFunction(&fn, module_, name));
    return fn;
  }
  // Device 0 still computes: a fill, read back.
  void ExpectDeviceZeroWorks() {
    ASSERT_EQ(orSuccess, orSetDevice(0));
    DeviceBuffer buf(256 * sizeof(uint32_t));
    OrTestFill p{reinterpret_cast<uint64_t>(buf.get()), 256, 42, 0};
    ASSERT_EQ(orSuccess, orLaunchFunction(nullptr, Function("or_test_fill_u32"),
                                          &p, sizeof(p), nullptr));
    std::vector<uint32_t> host(256, 0);
    ASSERT_EQ(orSuccess,
              orMemcpy(host.data(), buf.get(), 256 * 4, orMemcpyDeviceToHost));
    for (uint32_t v : host) {
      ASSERT_EQ(42u, v);
    }
  }
  // Every call that uses `device` now fails with orErrorDeviceLost.
  void ExpectLostEverywhere(int device) {
    ASSERT_EQ(orSuccess, orSetDevice(device));
    void* ptr = nullptr;
    EXPECT_EQ(orErrorDeviceLost, orMalloc(&ptr, 1024));
    EXPECT_EQ(orErrorDeviceLost, orDeviceSynchronize());
    char params[16] = {};
    EXPECT_EQ(orErrorDeviceLost,
              orLaunchFunction(nullptr, Function("or_test_fail"), params,
                               sizeof(params), nullptr));
    EXPECT_EQ(orErrorDeviceLost, orStreamQuery(nullptr));
    ASSERT_EQ(orSuccess, orSetDevice(0));
  }

  orModule_t module_ = nullptr;
};

TEST_F(ProcessDriverTest, EveryDeviceIsAChildProcess) {
  const std::map<int, int> children = DeviceProcesses(getpid());
  ASSERT_EQ(5u, children.size());
  for (int d = 0; d < 5; ++d) {
    EXPECT_EQ(1u, children.count(d)) << "device " << d;
  }
  // The user's process cannot launch host functions on such a device, nor
  // reach its memory.
  EXPECT_EQ(orErrorNotSupported, orLaunchKernel(nullptr, &NoOpKernel, nullptr));
  DeviceBuffer buf(64);
  void* kernel_view = nullptr;
  EXPECT_EQ(orErrorNotSupported, orGetKernelPointer(&kernel_view, buf.get()));
}

TEST_F(ProcessDriverTest, SegfaultingKernelLosesOnlyItsDevice) {
  const int pid = DeviceProcesses(getpid()).at(1);
  orFunction_t segfault = Function("or_test_segfault");
  ASSERT_EQ(orSuccess, orSetDevice(1));
  orStream_t stream = nullptr;
  ASSERT_EQ(orSuccess, orStreamCreate(&stream));
  ASSERT_EQ(orSuccess, orLaunchFunction(stream, segfault, nullptr, 0, nullptr));
  EXPECT_EQ(orErrorDeviceLost, orStreamSynchronize(stream));
  // A stream of a lost device can still be destroyed; it says why it
  // could not drain.
  EXPECT_EQ(orErrorDeviceLost, orStreamDestroy(stream));
  const std::string reason = LossReason(1);
  EXPECT_NE(std::string::npos, reason.find("device 1")) << reason;
  EXPECT_NE(std::string::npos, reason.find("SIGSEGV")) << reason;
  EXPECT_NE(std::string::npos,
            reason.find("while running kernel 'or_test_segfault' (writing "
                        "through a null pointer)"))
      << reason;
  EXPECT_TRUE(Vanishes(pid)) << "device process " << pid << " was not reaped";
  ExpectLostEverywhere(1);
  ExpectDeviceZeroWorks();
}

TEST_F(ProcessDriverTest, AbortingKernelLosesItsDevice) {
  orFunction_t abort_kernel = Function("or_test_abort");
  ASSERT_EQ(orSuccess, orSetDevice(3));
  ASSERT_EQ(orSuccess,
            orLaunchFunction(nullptr, abort_kernel, nullptr, 0, nullptr));
  EXPECT_EQ(orErrorDeviceLost, orDeviceSynchronize());
  EXPECT_NE(std::string::npos, LossReason(3).find("SIGABRT")) << LossReason(3);
  ExpectLostEverywhere(3);
  ExpectDeviceZeroWorks();
}

TEST_F(ProcessDriverTest, KilledDeviceProcessReleasesEveryWaiter) {
  // Device 2 holds a gate that is never opened, with an event recorded
  // behind it that a stream of device 0 waits for; then its process is
  // killed. Nothing waits forever: device 2's waits fail, device 0's
  // stream goes on.
  const int pid = DeviceProcesses(getpid()).at(2);
  void* words = nullptr;
  ASSERT_EQ(orSuccess, orMallocHost(&words, 8));
  std::memset(words, 0, 8);
  orFunction_t gate = Function("or_test_gate");
  ASSERT_EQ(orSuccess, orSetDevice(2));
  EventHandle event;
  orStream_t held = nullptr;
  ASSERT_EQ(orSuccess, orStreamCreate(&held));
  OrTestGate g{reinterpret_cast<uint64_t>(words),
               reinterpret_cast<uint64_t>(static_cast<uint32_t*>(words) + 1)};
  ASSERT_EQ(orSuccess, orLaunchFunction(held, gate, &g, sizeof(g), nullptr));
  ASSERT_EQ(orSuccess, orEventRecord(event.get(), held));
  ASSERT_EQ(orSuccess, orSetDevice(0));
  StreamHandle waiter;
  ASSERT_EQ(orSuccess, orStreamWaitEvent(waiter.get(), event.get()));
  while (static_cast<volatile uint32_t*>(words)[0] == 0) {
    std::this_thread::yield();
  }
  EXPECT_EQ(orErrorNotReady, orStreamQuery(waiter.get()));
  ASSERT_EQ(0, kill(pid, SIGKILL));
  EXPECT_EQ(orErrorDeviceLost, orStreamSynchronize(held));
  EXPECT_EQ(orErrorDeviceLost, orStreamDestroy(held));
  EXPECT_EQ(orErrorDeviceLost, orEventSynchronize(event.get()));
  EXPECT_EQ(orSuccess, orStreamSynchronize(waiter.get()));
  EXPECT_NE(std::string::npos, LossReason(2).find("SIGKILL")) << LossReason(2);
  EXPECT_TRUE(Vanishes(pid));
  ExpectLostEverywhere(2);
  ExpectDeviceZeroWorks();
  EXPECT_EQ(orSuccess, orFreeHost(words));
  // The event of the lost device is destroyed by its handle now: nothing
  // of the device is waited for.
}

TEST_F(ProcessDriverTest, SimulatedLossEndsTheDeviceProcess) {
  const int pid = DeviceProcesses(getpid()).at(4);
  ASSERT_EQ(orSuccess, orSimulateDeviceLoss(4, "injected by the test"));
  ASSERT_TRUE(BecomesLost(4));
  const std::string reason = LossReason(4);
  EXPECT_NE(std::string::npos, reason.find("injected by the test")) << reason;
  EXPECT_TRUE(Vanishes(pid));
  ExpectLostEverywhere(4);
  ExpectDeviceZeroWorks();
}

// Run by NoDeviceProcessOutlivesAKilledUserProcess in a child: starts the
// devices, writes their pids to the pipe, then waits to be killed.
TEST(ProcessDriverHelper, HoldDevices) {
  const char* fd_text = std::getenv("OPENREG_TEST_HOLD_FD");
  if (fd_text == nullptr) {
    GTEST_SKIP() << "run by NoDeviceProcessOutlivesAKilledUserProcess";
  }
  ASSERT_EQ(orSuccess, orInit());
  std::string pids;
  for (auto [device, pid] : DeviceProcesses(getpid())) {
    pids += std::to_string(pid) + " ";
  }
  pids += "\n";
  const int fd = std::atoi(fd_text);
  ASSERT_EQ(static_cast<ssize_t>(pids.size()),
            write(fd, pids.data(), pids.size()));
  close(fd);
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST(ProcessDriverExit, NoDeviceProcessOutlivesAKilledUserProcess) {
  int fds[2];
  ASSERT_EQ(0, pipe(fds));
  std::string env_fd = "OPENREG_TEST_HOLD_FD=" + std::to_string(fds[1]);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    env.push_back(*e);
  }
  env.push_back(const_cast<char*>(env_fd.c_str()));
  env.push_back(nullptr);
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  char filter[] = "--gtest_filter=ProcessDriverHelper.HoldDevices";
  char* argv[] = {self, filter, nullptr};
  pid_t helper = -1;
  ASSERT_EQ(0, posix_spawn(&helper, self, nullptr, nullptr, argv, env.data()));
  close(fds[1]);
  std::string line;
  char buf[256];
  ssize_t n = 0;
  while (line.find('\n') == std::string::npos &&
         (n = read(fds[0], buf, sizeof(buf))) > 0) {
    line.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  std::vector<int> pids;
  for (const char* p = line.c_str(); *p != '\0' && *p != '\n';) {
    char* end = nullptr;
    pids.push_back(static_cast<int>(std::strtol(p, &end, 10)));
    p = end;
    while (*p == ' ') ++p;
  }
  ASSERT_EQ(5u, pids.size()) << "helper said: " << line;
  ASSERT_EQ(0, kill(helper, SIGKILL));
  int status = 0;
  ASSERT_EQ(helper, waitpid(helper, &status, 0));
  for (int pid : pids) {
    // Orphans are re-parented and reaped by init: gone, not zombies of ours.
    EXPECT_TRUE(Vanishes(pid)) << "device process " << pid << " survived";
  }
}

}  // namespace
}  // namespace openreg_test
