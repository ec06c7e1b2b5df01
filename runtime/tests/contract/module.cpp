// Contract: named kernels (modules, functions, launches with byte
// parameters). The kernels are those of tests/kernels/test_kernels.cpp,
// loaded from OPENREG_TEST_KERNELS (default: the build's library).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "contract/module_fixture.h"
#include "kernels/test_kernels.h"
#include "test_util.h"

namespace openreg_test {
namespace {

TEST_F(ModuleTest, LoadRejectsBadArguments) {
  orModule_t m = reinterpret_cast<orModule_t>(0x1);
  EXPECT_EQ(orErrorInvalidValue, orModuleLoad(nullptr, KernelsPath()));
  EXPECT_EQ(orErrorInvalidValue, orModuleLoad(&m, nullptr));
  EXPECT_EQ(nullptr, m);
  EXPECT_EQ(orErrorInvalidValue, orModuleLoad(&m, ""));
  EXPECT_EQ(orErrorFileNotFound,
            orModuleLoad(&m, "/nonexistent/libopenreg_no_kernels.so"));
  EXPECT_EQ(nullptr, m);
  // A file that is not a shared object.
  EXPECT_EQ(orErrorFileNotFound, orModuleLoad(&m, "/proc/self/status"));
  EXPECT_EQ(orErrorInvalidResourceHandle, orModuleUnload(nullptr));
}

TEST_F(ModuleTest, LoadExSaysWhyALoadFailed) {
  orModule_t m = reinterpret_cast<orModule_t>(0x1);
  char log[256];
  EXPECT_EQ(orErrorFileNotFound,
            orModuleLoadEx(&m, "/nonexistent/libopenreg_no_kernels.so", log,
                           sizeof(log)));
  EXPECT_EQ(nullptr, m);
  // The loader's message names the file, from whichever process failed.
  EXPECT_NE(nullptr, std::strstr(log, "libopenreg_no_kernels.so")) << log;
  char small[8];
  EXPECT_EQ(orErrorFileNotFound,
            orModuleLoadEx(&m, "/proc/self/status", small, sizeof(small)));
  EXPECT_EQ(7u, std::strlen(small));  // truncated, terminated
  EXPECT_EQ(orErrorInvalidValue, orModuleLoadEx(&m, KernelsPath(), nullptr, 4));
  OR_ASSERT_OK(orModuleLoadEx(&m, KernelsPath(), log, sizeof(log)));
  EXPECT_STREQ("", log);
  EXPECT_NE(nullptr, m);
  OR_ASSERT_OK(orModuleUnload(m));
  OR_ASSERT_OK(orModuleLoadEx(&m, KernelsPath(), nullptr, 0));
  OR_ASSERT_OK(orModuleUnload(m));
}

TEST_F(ModuleTest, GetFunctionFindsKernelsByName) {
  orFunction_t fn = reinterpret_cast<orFunction_t>(0x1);
  EXPECT_EQ(orErrorSymbolNotFound,
            orModuleGetFunction(&fn, module_, "or_test_no_such_kernel"));
  EXPECT_EQ(nullptr, fn);
  EXPECT_EQ(orErrorInvalidValue, orModuleGetFunction(nullptr, module_, "x"));
  EXPECT_EQ(orErrorInvalidValue, orModuleGetFunction(&fn, module_, nullptr));
  EXPECT_EQ(orErrorInvalidResourceHandle,
            orModuleGetFunction(&fn, nullptr, "or_test_fill_u32"));
  orFunction_t a = nullptr;
  orFunction_t b = nullptr;
  OR_ASSERT_OK(orModuleGetFunction(&a, module_, "or_test_fill_u32"));
  OR_ASSERT_OK(orModuleGetFunction(&b, module_, "or_test_fill_u32"));
  EXPECT_NE(nullptr, a);
  EXPECT_EQ(a, b);
}

TEST_F(ModuleTest, LaunchRunsTheKernelOnDeviceMemory) {
  constexpr size_t kCount = 1000;
  DeviceBuffer buf(kCount * sizeof(uint32_t));
  OrTestFill fill{reinterpret_cast<uint64_t>(buf.get()), kCount, 0xabcd1234u,
                  0};
  OR_ASSERT_OK(Launch(nullptr, "or_test_fill_u32", fill));
  std::vector<uint32_t> host(kCount, 0);
  OR_ASSERT_OK(orMemcpy(host.data(), buf.get(), kCount * sizeof(uint32_t),
                        orMemcpyDeviceToHost));
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(0xabcd1234u, host[i]) << i;
  }
}

TEST_F(ModuleTest, ParametersAreCopiedAtTheLaunch) {
  // The first launch waits behind a gate while the caller overwrites and
  // reuses its parameter buffer: the kernels see what each launch was given.
  PinnedWords gate(2);
  StreamHandle stream;
  DeviceBuffer buf(4 * sizeof(uint32_t));
  OrTestGate g{gate.address(0), gate.address(1)};
  OR_ASSERT_OK(Launch(stream.get(), "or_test_gate", g));
  OrTestFill p{reinterpret_cast<uint64_t>(buf.get()), 4, 1, 0};
  OR_ASSERT_OK(Launch(stream.get(), "or_test_fill_u32", p));
  p.value = 5;
  OR_ASSERT_OK(Launch(stream.get(), "or_test_scale_add_u32", p));
  p.value = 99;  // after both launches: seen by neither
  std::memset(&g, 0, sizeof(g));
  gate[1] = 1;
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  uint32_t host[4] = {};
  OR_ASSERT_OK(orMemcpy(host, buf.get(), sizeof(host), orMemcpyDeviceToHost));
  for (uint32_t v : host) {
    EXPECT_EQ(1u * 2 + 5, v);  // fill(1), then *2 + 5, in stream order
  }
}

TEST_F(ModuleTest, QueryAndSynchronizeSeeARunningKernel) {
  PinnedWords gate(2);
  StreamHandle stream;
  OrTestGate g{gate.address(0), gate.address(1)};
  OR_ASSERT_OK(Launch(stream.get(), "or_test_gate", g));
  while (gate[0] == 0) {
    std::this_thread::yield();
  }
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  gate[1] = 1;
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  OR_EXPECT_OK(orStreamQuery(stream.get()));
}

// orKernelContext::team_threads: between 1 and the threads asked for, and
// all of them while the host waits for the device.
TEST_F(ModuleTest, TeamThreadsAreAllThreadsWhileTheHostWaits) {
  PinnedWords result(2);
  // Asked while the host runs: it reads the answer from pinned memory and
  // never waits in the driver.
  OR_ASSERT_OK(Launch(nullptr, "or_test_team_threads",
                      OrTestTeamThreads{result.address(0), 4, 0}));
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (result[0] == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  EXPECT_GE(result[0], 1u);
  EXPECT_LE(result[0], 4u);
  // Asked until it answers all four, which it must once the host waits.
  OR_ASSERT_OK(Launch(nullptr, "or_test_team_threads",
                      OrTestTeamThreads{result.address(1), 4, 1}));
  OR_ASSERT_OK(orStreamSynchronize(nullptr));
  EXPECT_EQ(4u, result[1]);
}

TEST_F(ModuleTest, KernelSeesItsDeviceAndWhatIsDeviceMemory) {
  PinnedWords result(1);
  DeviceBuffer buf(64);
  int host_value = 0;
  const uint64_t probes[] = {reinterpret_cast<uint64_t>(buf.get()),
                             reinterpret_cast<uint64_t>(buf.bytes() + 60),
                             reinterpret_cast<uint64_t>(&host_value)};
  const uint32_t reachable[] = {1, 1, 0};
  for (int i = 0; i < 3; ++i) {
    OrTestProbe p{probes[i], result.address(0)};
    OR_ASSERT_OK(Launch(nullptr, "or_test_probe", p));
    OR_ASSERT_OK(orDeviceSynchronize());
    EXPECT_EQ(reachable[i], result[0] & 1u) << "probe " << i;
    EXPECT_EQ(0u, result[0] >> 8);
  }
}

TEST_F(ModuleTest, KernelRunsOnTheStreamsDevice) {
  OR_REQUIRE_DEVICES(2);
  PinnedWords result(1);
  OR_ASSERT_OK(orSetDevice(1));
  DeviceBuffer buf(64);
  orStream_t dflt = nullptr;
  OR_ASSERT_OK(orDeviceGetDefaultStream(1, &dflt));
  OR_ASSERT_OK(orSetDevice(0));
  OrTestProbe p{reinterpret_cast<uint64_t>(buf.get()), result.address(0)};
  OR_ASSERT_OK(Launch(dflt, "or_test_probe", p));
  OR_ASSERT_OK(orStreamSynchronize(dflt));
  EXPECT_EQ(1u | (1u << 8), result[0]);
}

TEST_F(ModuleTest, FailureIsReportedWithItsMessageAndCleared) {
  StreamHandle stream;
  const char text[] = "the kernel refused its input";
  OR_ASSERT_OK(orLaunchFunction(stream.get(), Function("or_test_fail"), text,
                                sizeof(text), nullptr));
  EXPECT_EQ(orErrorLaunchFailure, orStreamSynchronize(stream.get()));
  char message[128] = "x";
  OR_ASSERT_OK(orStreamGetErrorMessage(stream.get(), message, sizeof(message)));
  EXPECT_STREQ(text, message);
  // Truncated to the buffer, always terminated.
  char small[8];
  OR_ASSERT_OK(orStreamGetErrorMessage(stream.get(), small, sizeof(small)));
  EXPECT_EQ(std::string(text, 7), small);
  // Reported once; the stream keeps working.
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));
  OR_ASSERT_OK(orStreamGetErrorMessage(stream.get(), message, sizeof(message)));
  EXPECT_STREQ("", message);
  // Without a message, the driver names the kernel, what it described and
  // what it returned.
  OR_ASSERT_OK(orLaunchFunction(stream.get(), Function("or_test_fail"), nullptr,
                                0, nullptr));
  EXPECT_EQ(orErrorLaunchFailure, orStreamSynchronize(stream.get()));
  OR_ASSERT_OK(orStreamGetErrorMessage(stream.get(), message, sizeof(message)));
  EXPECT_STREQ("kernel 'or_test_fail' (step 3 of 5) failed (returned 7)",
               message);
  EXPECT_EQ(orErrorInvalidValue,
            orStreamGetErrorMessage(stream.get(), nullptr, 4));
}

TEST_F(ModuleTest, LaunchRejectsBadArguments) {
  orFunction_t fn = Function("or_test_fill_u32");
  char params[16] = {};
  EXPECT_EQ(orErrorInvalidValue, orLaunchFunction(nullptr, nullptr, params,
                                                  sizeof(params), nullptr));
  EXPECT_EQ(orErrorInvalidValue,
            orLaunchFunction(nullptr, fn, nullptr, 16, nullptr));
  std::vector<char> big(OR_MAX_KERNEL_PARAMS + 1);
  EXPECT_EQ(orErrorInvalidValue,
            orLaunchFunction(nullptr, fn, big.data(), big.size(), nullptr));
  orLaunchAttributes bad{};
  bad.hostThreads = -1;
  EXPECT_EQ(orErrorInvalidValue,
            orLaunchFunction(nullptr, fn, params, sizeof(params), &bad));
}

TEST_F(ModuleTest, LargestParameterBlockArrives) {
  // OR_MAX_KERNEL_PARAMS bytes: a header, then data the kernel hashes.
  PinnedWords result(2);  // one uint64
  std::vector<unsigned char> params(OR_MAX_KERNEL_PARAMS);
  OrTestChecksumHeader h{result.address(0)};
  std::memcpy(params.data(), &h, sizeof(h));
  for (size_t i = sizeof(h); i < params.size(); ++i) {
    params[i] = static_cast<unsigned char>(i * 131 + 7);
  }
  OR_ASSERT_OK(orLaunchFunction(nullptr, Function("or_test_checksum"),
                                params.data(), params.size(), nullptr));
  OR_ASSERT_OK(orDeviceSynchronize());
  uint64_t got = 0;
  std::memcpy(&got, const_cast<uint32_t*>(&result[0]), sizeof(got));
  EXPECT_EQ(or_test_fnv1a(params.data() + sizeof(h), params.size() - sizeof(h)),
            got);
}

TEST_F(ModuleTest, ParameterBlocksOfChangingSizesArriveIntactOverManyLaunches) {
  // More launches than a stream queues at once, of sizes that grow, shrink
  // and cross every few KiB (a driver may reuse its copies' memory between
  // launches): each kernel hashes the bytes it was given.
  constexpr size_t kLaunches = 3000;
  PinnedWords result(2 * kLaunches);  // one uint64 per launch
  StreamHandle stream;
  std::vector<uint64_t> expected(kLaunches);
  std::vector<unsigned char> params;
  for (size_t k = 0; k < kLaunches; ++k) {
    const size_t data = (k * 977) % (k % 7 == 0 ? 9000 : 600);
    params.assign(sizeof(OrTestChecksumHeader) + data, 0);
    OrTestChecksumHeader h{result.address(2 * k)};
    std::memcpy(params.data(), &h, sizeof(h));
    for (size_t i = 0; i < data; ++i) {
      params[sizeof(h) + i] = static_cast<unsigned char>(i * 31 + k);
    }
    expected[k] = or_test_fnv1a(params.data() + sizeof(h), data);
    OR_ASSERT_OK(orLaunchFunction(stream.get(), Function("or_test_checksum"),
                                  params.data(), params.size(), nullptr));
  }
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  for (size_t k = 0; k < kLaunches; ++k) {
    uint64_t got = 0;
    std::memcpy(&got, const_cast<uint32_t*>(&result[2 * k]), sizeof(got));
    ASSERT_EQ(expected[k], got) << "launch " << k;
  }
}

// Streams and events with named kernels: what every driver must do,
// including one whose kernels cannot be host functions.

TEST_F(ModuleTest, EventCompletesWithTheWorkBeforeIt) {
  StreamHandle stream;
  EventHandle event;
  GateLaunch gate(this, stream.get());
  OR_ASSERT_OK(orEventRecord(event.get(), stream.get()));
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orEventQuery(event.get()));
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  gate.Open();
  OR_ASSERT_OK(orEventSynchronize(event.get()));
  OR_EXPECT_OK(orEventQuery(event.get()));
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));
}

TEST_F(ModuleTest, StreamWaitEventOrdersKernelsAcrossStreams) {
  StreamHandle first;
  StreamHandle second;
  EventHandle event;
  DeviceBuffer buf(16 * sizeof(uint32_t));
  OrTestFill p{reinterpret_cast<uint64_t>(buf.get()), 16, 1, 0};
  GateLaunch gate(this, first.get());
  OR_ASSERT_OK(Launch(first.get(), "or_test_fill_u32", p));
  OR_ASSERT_OK(orEventRecord(event.get(), first.get()));
  OR_ASSERT_OK(orStreamWaitEvent(second.get(), event.get()));
  p.value = 5;
  OR_ASSERT_OK(Launch(second.get(), "or_test_scale_add_u32", p));
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orStreamQuery(second.get()));
  gate.Open();
  OR_ASSERT_OK(orStreamSynchronize(second.get()));
  for (uint32_t v : ReadBack(buf, 16)) {
    EXPECT_EQ(7u, v);  // fill(1) first, then * 2 + 5
  }
}

TEST_F(ModuleTest, StreamWaitEventAcrossDevices) {
  OR_REQUIRE_DEVICES(2);
  StreamHandle on0;
  EventHandle event;  // device 0
  GateLaunch gate(this, on0.get());
  OR_ASSERT_OK(orEventRecord(event.get(), on0.get()));
  OR_ASSERT_OK(orSetDevice(1));
  {
    StreamHandle on1;
    DeviceBuffer buf(4 * sizeof(uint32_t));
    OR_ASSERT_OK(orStreamWaitEvent(on1.get(), event.get()));
    OrTestFill p{reinterpret_cast<uint64_t>(buf.get()), 4, 3, 0};
    OR_ASSERT_OK(Launch(on1.get(), "or_test_fill_u32", p));
    gate.WaitEntered();
    EXPECT_EQ(orErrorNotReady, orStreamQuery(on1.get()));
    gate.Open();
    OR_ASSERT_OK(orStreamSynchronize(on1.get()));
    for (uint32_t v : ReadBack(buf, 4)) {
      EXPECT_EQ(3u, v);
    }
  }
  OR_ASSERT_OK(orSetDevice(0));
}

TEST_F(ModuleTest, ElapsedTimeCoversTheKernelsBetweenTheEvents) {
  StreamHandle stream;
  EventHandle start;
  EventHandle end;
  OR_ASSERT_OK(orEventRecord(start.get(), stream.get()));
  {
    GateLaunch gate(this, stream.get());
    OR_ASSERT_OK(orEventRecord(end.get(), stream.get()));
    gate.WaitEntered();
    float ms = 0;
    EXPECT_EQ(orErrorNotReady, orEventElapsedTime(&ms, start.get(), end.get()));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }  // opens the gate
  OR_ASSERT_OK(orEventSynchronize(end.get()));
  float ms = 0;
  OR_ASSERT_OK(orEventElapsedTime(&ms, start.get(), end.get()));
  EXPECT_GE(ms, 25.0f);
  EXPECT_LT(ms, 10000.0f);
}

TEST_F(ModuleTest, EventDestroyedWithItsRecordStillQueued) {
  StreamHandle stream;
  GateLaunch gate(this, stream.get());
  orEvent_t event = nullptr;
  OR_ASSERT_OK(orEventCreate(&event));
  OR_ASSERT_OK(orEventRecord(event, stream.get()));
  gate.WaitEntered();
  // Returns at once, as cudaEventDestroy does: the gate is still closed.
  OR_EXPECT_OK(orEventDestroy(event));
  gate.Open();
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));
  // A new event works as usual.
  EventHandle again;
  OR_ASSERT_OK(orEventRecord(again.get(), stream.get()));
  OR_EXPECT_OK(orEventSynchronize(again.get()));
}

// True once `stream` is idle, false if it is still busy after two seconds.
bool DrainsWithinTwoSeconds(orStream_t stream) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (orStreamQuery(stream) == orErrorNotReady) {
    if (std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST_F(ModuleTest, WaitQueuedForADestroyedEventIsNotUndoneByTheNext) {
  // torch's Stream.wait_stream: record on one stream, wait on another,
  // destroy the event. The waiting stream is still busy, so its wait runs
  // after the event is gone and its resources may serve the next event;
  // that event, never recorded, must not hold the wait back.
  StreamHandle producer;
  StreamHandle consumer;
  auto consumer_gate = std::make_unique<GateLaunch>(this, consumer.get());
  {
    GateLaunch producer_gate(this, producer.get());
    orEvent_t event = nullptr;
    OR_ASSERT_OK(orEventCreate(&event));
    OR_ASSERT_OK(orEventRecord(event, producer.get()));
    OR_ASSERT_OK(orStreamWaitEvent(consumer.get(), event));
    producer_gate.Open();
    OR_ASSERT_OK(orStreamSynchronize(producer.get()));
    OR_ASSERT_OK(orEventDestroy(event));
  }
  std::vector<std::unique_ptr<EventHandle>> next;
  for (int i = 0; i < 8; ++i) {
    next.push_back(std::make_unique<EventHandle>());
  }
  consumer_gate->Open();
  const bool drained = DrainsWithinTwoSeconds(consumer.get());
  EXPECT_TRUE(drained) << "the consumer's wait was undone by a new event";
  if (!drained) {
    for (auto& event : next) {  // unblock it, so the test can end
      OR_EXPECT_OK(orEventRecord(event->get(), producer.get()));
    }
  }
  consumer_gate.reset();
}

TEST_F(ModuleTest, AsyncCopiesWithPinnedMemoryRunInStreamOrder) {
  // H2D from pinned memory, a kernel, D2H to pinned memory: all queued
  // behind a gate, then checked after one synchronization.
  constexpr size_t kCount = 1 << 16;
  StreamHandle stream;
  DeviceBuffer buf(kCount * sizeof(uint32_t));
  void* in = nullptr;
  void* out = nullptr;
  OR_ASSERT_OK(orMallocHost(&in, kCount * sizeof(uint32_t)));
  OR_ASSERT_OK(orMallocHost(&out, kCount * sizeof(uint32_t)));
  for (size_t i = 0; i < kCount; ++i) {
    static_cast<uint32_t*>(in)[i] = static_cast<uint32_t>(i);
  }
  {
    GateLaunch gate(this, stream.get());
    OR_ASSERT_OK(orMemcpyAsync(buf.get(), in, kCount * sizeof(uint32_t),
                               orMemcpyHostToDevice, stream.get()));
    OrTestFill p{reinterpret_cast<uint64_t>(buf.get()), kCount, 1, 0};
    OR_ASSERT_OK(Launch(stream.get(), "or_test_scale_add_u32", p));
    OR_ASSERT_OK(orMemcpyAsync(out, buf.get(), kCount * sizeof(uint32_t),
                               orMemcpyDeviceToHost, stream.get()));
    gate.WaitEntered();
    EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  }
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(static_cast<uint32_t>(i * 2 + 1), static_cast<uint32_t*>(out)[i])
        << i;
  }
  OR_EXPECT_OK(orFreeHost(in));
  OR_EXPECT_OK(orFreeHost(out));
}

TEST_F(ModuleTest, PageableCopiesLargerThanAnyStagingBuffer) {
  // 40 MB and 12 bytes each way through pageable host memory (a driver that
  // stages in chunks reuses its buffers and ends on a partial chunk), and a
  // memset.
  constexpr size_t kCount = (size_t{10} << 20) + 3;
  DeviceBuffer buf(kCount * sizeof(uint32_t));
  std::vector<uint32_t> host(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    host[i] = static_cast<uint32_t>(i * 2654435761u);
  }
  OR_ASSERT_OK(orMemcpy(buf.get(), host.data(), kCount * sizeof(uint32_t),
                        orMemcpyHostToDevice));
  OR_ASSERT_OK(orMemset(buf.bytes() + 4, 0, 8));
  std::vector<uint32_t> back = ReadBack(buf, kCount);
  host[1] = 0;
  host[2] = 0;
  EXPECT_TRUE(back == host);
}

orError_t TakeWarningsStatus(int device) {
  return orDeviceTakeWarnings(
      device, [](void*, const char*) {}, nullptr);
}

std::vector<std::string> TakeWarnings(int device) {
  std::vector<std::string> taken;
  EXPECT_EQ(
      orSuccess,
      orDeviceTakeWarnings(
          device,
          [](void* out, const char* message) {
            static_cast<std::vector<std::string>*>(out)->push_back(message);
          },
          &taken));
  return taken;
}

TEST_F(ModuleTest, WarningsReachTheHostOnceInOrder) {
  EXPECT_EQ(orErrorInvalidValue, orDeviceTakeWarnings(0, nullptr, nullptr));
  int count = 0;
  OR_ASSERT_OK(orGetDeviceCount(&count));
  EXPECT_EQ(orErrorInvalidDevice, TakeWarningsStatus(count));
  EXPECT_TRUE(TakeWarnings(0).empty());
  OR_ASSERT_OK(Launch(nullptr, "or_test_warn", OrTestWarn{0, 2}));
  OR_ASSERT_OK(Launch(nullptr, "or_test_warn", OrTestWarn{2, 1}));
  OR_ASSERT_OK(orDeviceSynchronize());
  EXPECT_EQ((std::vector<std::string>{"warning 0", "warning 1", "warning 2"}),
            TakeWarnings(0));
  EXPECT_TRUE(TakeWarnings(0).empty()) << "taken once";
  // Another device's warnings are its own.
  if (count > 1) {
    OR_ASSERT_OK(orSetDevice(1));
    OR_ASSERT_OK(Launch(nullptr, "or_test_warn", OrTestWarn{7, 1}));
    OR_ASSERT_OK(orDeviceSynchronize());
    OR_ASSERT_OK(orSetDevice(0));
    EXPECT_TRUE(TakeWarnings(0).empty());
    EXPECT_EQ(std::vector<std::string>{"warning 7"}, TakeWarnings(1));
  }
}

TEST_F(ModuleTest, WarningsPastTheLimitAreCounted) {
  constexpr uint32_t kExtra = 5;
  OR_ASSERT_OK(Launch(nullptr, "or_test_warn",
                      OrTestWarn{0, OR_MAX_PENDING_WARNINGS + kExtra}));
  OR_ASSERT_OK(orDeviceSynchronize());
  const std::vector<std::string> taken = TakeWarnings(0);
  ASSERT_EQ(static_cast<size_t>(OR_MAX_PENDING_WARNINGS) + 1, taken.size());
  EXPECT_EQ("warning 0", taken.front());
  EXPECT_EQ("warning " + std::to_string(OR_MAX_PENDING_WARNINGS - 1),
            taken[OR_MAX_PENDING_WARNINGS - 1]);
  EXPECT_NE(std::string::npos,
            taken.back().find(std::to_string(kExtra) + " more warnings"))
      << taken.back();
  // Taking them makes room again.
  OR_ASSERT_OK(Launch(nullptr, "or_test_warn", OrTestWarn{100, 1}));
  OR_ASSERT_OK(orDeviceSynchronize());
  EXPECT_EQ(std::vector<std::string>{"warning 100"}, TakeWarnings(0));
}

// The host wait check (orSetHostWaitCheck): what a check that says "stop"
// does to each kind of synchronization, and that the work goes on.
std::atomic<int> g_checks{0};
int StopAtSecondCheck() { return g_checks.fetch_add(1) >= 1 ? 1 : 0; }

TEST_F(ModuleTest, HostWaitCheckEndsALongSynchronizationAndTheWorkGoesOn) {
  StreamHandle stream;
  EventHandle event;
  GateLaunch gate(this, stream.get());
  OR_ASSERT_OK(orEventRecord(event.get(), stream.get()));
  gate.WaitEntered();
  OR_ASSERT_OK(orSetHostWaitCheck(&StopAtSecondCheck));
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind);
    g_checks = 0;
    const auto start = std::chrono::steady_clock::now();
    const orError_t err = kind == 0   ? orStreamSynchronize(stream.get())
                          : kind == 1 ? orEventSynchronize(event.get())
                                      : orDeviceSynchronize();
    EXPECT_EQ(orErrorInterrupted, err);
    EXPECT_GE(g_checks.load(), 2);  // called while the wait lasted
    EXPECT_GE(std::chrono::steady_clock::now() - start,
              std::chrono::milliseconds(15));
    EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));  // still runs
  }
  OR_ASSERT_OK(orSetHostWaitCheck(nullptr));
  gate.Open();
  OR_EXPECT_OK(orEventSynchronize(event.get()));
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));
}

TEST_F(ModuleTest, HostWaitCheckIsNotCalledForShortWaits) {
  StreamHandle stream;
  g_checks = 0;
  OR_ASSERT_OK(orSetHostWaitCheck(&StopAtSecondCheck));
  DeviceBuffer buf(64 * sizeof(uint32_t));
  for (int i = 0; i < 20; ++i) {
    OR_ASSERT_OK(Launch(stream.get(), "or_test_fill_u32",
                        OrTestFill{reinterpret_cast<uint64_t>(buf.get()), 64,
                                   static_cast<uint32_t>(i), 0}));
    OR_EXPECT_OK(orStreamSynchronize(stream.get()));
  }
  OR_ASSERT_OK(orSetHostWaitCheck(nullptr));
  EXPECT_EQ(0, g_checks.load());
}

}  // namespace
}  // namespace openreg_test
