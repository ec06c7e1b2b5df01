// Streams: creation, priorities, kernel launch order, query/synchronize
// semantics, launch failures, and concurrent launches.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "test_util.h"

namespace {

using openreg_test::DeviceCount;
using openreg_test::FailingKernel;
using openreg_test::Gate;
using openreg_test::RuntimeTest;
using openreg_test::SleepKernel;
using openreg_test::StreamHandle;

class StreamTest : public RuntimeTest {};

// Appends `value` to `log` when it runs.
struct Step {
  std::vector<int>* log;
  int value;
};

int RecordStep(void* arg) {
  auto* s = static_cast<Step*>(arg);
  s->log->push_back(s->value);
  return 0;
}

int SetFlag(void* flag) {
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  static_cast<std::atomic<bool>*>(flag)->store(true);
  return 0;
}

TEST_F(StreamTest, CreateQueryAndDestroy) {
  orStream_t stream = reinterpret_cast<orStream_t>(0x1);
  OR_ASSERT_OK(orStreamCreate(&stream));
  ASSERT_NE(nullptr, stream);
  int device = -1;
  OR_ASSERT_OK(orStreamGetDevice(stream, &device));
  EXPECT_EQ(0, device);
  int priority = 99;
  OR_ASSERT_OK(orStreamGetPriority(stream, &priority));
  EXPECT_EQ(0, priority);
  OR_EXPECT_OK(orStreamQuery(stream));        // nothing enqueued
  OR_EXPECT_OK(orStreamSynchronize(stream));  // returns at once
  OR_ASSERT_OK(orStreamDestroy(stream));
}

TEST_F(StreamTest, StreamBelongsToCurrentDevice) {
  OR_REQUIRE_DEVICES(2);
  OR_ASSERT_OK(orSetDevice(1));
  StreamHandle stream;
  OR_ASSERT_OK(orSetDevice(0));
  int device = -1;
  OR_ASSERT_OK(orStreamGetDevice(stream.get(), &device));
  EXPECT_EQ(1, device);
}

TEST_F(StreamTest, NullStreamIsTheCurrentDevicesDefaultStream) {
  const int count = DeviceCount();
  for (int d = 0; d < count; ++d) {
    SCOPED_TRACE(d);
    orStream_t def = nullptr;
    OR_ASSERT_OK(orDeviceGetDefaultStream(d, &def));
    ASSERT_NE(nullptr, def);
    int device = -1;
    OR_ASSERT_OK(orStreamGetDevice(def, &device));
    EXPECT_EQ(d, device);
    OR_ASSERT_OK(orSetDevice(d));
    OR_ASSERT_OK(orStreamGetDevice(nullptr, &device));
    EXPECT_EQ(d, device);
    int priority = 99;
    OR_ASSERT_OK(orStreamGetPriority(nullptr, &priority));
    EXPECT_EQ(0, priority);
    // Same handle every time.
    orStream_t again = nullptr;
    OR_ASSERT_OK(orDeviceGetDefaultStream(d, &again));
    EXPECT_EQ(def, again);
  }
}

TEST_F(StreamTest, PriorityIsClampedIntoRange) {
  int least = 0;
  int greatest = 0;
  OR_ASSERT_OK(orDeviceGetStreamPriorityRange(&least, &greatest));
  ASSERT_LE(greatest, least);
  struct Case {
    int requested;
    int expected;
  };
  std::vector<Case> cases = {
      {least, least},           {greatest, greatest},
      {least + 1, least},       {least + 1000, least},
      {greatest - 1, greatest}, {greatest - 1000, greatest},
      {INT32_MAX, least},       {INT32_MIN, greatest}};
  for (int p = greatest; p <= least; ++p) cases.push_back({p, p});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.requested);
    orStream_t stream = nullptr;
    OR_ASSERT_OK(orStreamCreateWithPriority(&stream, c.requested));
    int priority = 12345;
    OR_ASSERT_OK(orStreamGetPriority(stream, &priority));
    EXPECT_EQ(c.expected, priority);
    OR_ASSERT_OK(orStreamDestroy(stream));
  }
}

TEST_F(StreamTest, BadHandlesAndArguments) {
  OR_REQUIRE_HOST_KERNELS();
  EXPECT_EQ(orErrorInvalidValue, orStreamCreate(nullptr));
  EXPECT_EQ(orErrorInvalidValue, orStreamCreateWithPriority(nullptr, 0));
  EXPECT_EQ(orErrorInvalidResourceHandle, orStreamDestroy(nullptr));
  EXPECT_EQ(orErrorInvalidValue, orStreamGetPriority(nullptr, nullptr));
  EXPECT_EQ(orErrorInvalidValue, orStreamGetDevice(nullptr, nullptr));

  StreamHandle stream;
  EXPECT_EQ(orErrorInvalidValue, orStreamGetPriority(stream.get(), nullptr));
  EXPECT_EQ(orErrorInvalidValue, orStreamGetDevice(stream.get(), nullptr));
  EXPECT_EQ(orErrorInvalidValue,
            orLaunchKernel(stream.get(), nullptr, nullptr));
  EXPECT_EQ(orErrorInvalidValue, orLaunchKernel(nullptr, nullptr, nullptr));
  EXPECT_EQ(orErrorInvalidValue,
            orLaunchKernelEx(stream.get(), nullptr, nullptr, nullptr));
  orLaunchAttributes negative{};
  negative.hostThreads = -1;
  std::vector<int> log;
  Step step{&log, 1};
  EXPECT_EQ(orErrorInvalidValue,
            orLaunchKernelEx(stream.get(), RecordStep, &step, &negative));
  OR_EXPECT_OK(orStreamQuery(stream.get()));  // nothing was enqueued
}

TEST_F(StreamTest, DefaultStreamCannotBeDestroyed) {
  OR_REQUIRE_HOST_KERNELS();
  const int count = DeviceCount();
  for (int d = 0; d < count; ++d) {
    orStream_t def = nullptr;
    OR_ASSERT_OK(orDeviceGetDefaultStream(d, &def));
    EXPECT_EQ(orErrorInvalidResourceHandle, orStreamDestroy(def));
    // Still usable afterwards.
    std::vector<int> log;
    Step step{&log, 1};
    OR_ASSERT_OK(orLaunchKernel(def, RecordStep, &step));
    OR_ASSERT_OK(orStreamSynchronize(def));
    EXPECT_EQ(std::vector<int>{1}, log);
  }
}

TEST_F(StreamTest, KernelsRunInLaunchOrder) {
  OR_REQUIRE_HOST_KERNELS();
  for (bool use_default : {false, true}) {
    SCOPED_TRACE(use_default ? "default stream" : "created stream");
    StreamHandle created;
    orStream_t stream = use_default ? nullptr : created.get();
    std::vector<int> log;
    std::vector<Step> steps;
    const int kSteps = 200;
    steps.reserve(kSteps);
    for (int i = 0; i < kSteps; ++i) steps.push_back({&log, i});
    for (auto& s : steps) {
      OR_ASSERT_OK(orLaunchKernel(stream, RecordStep, &s));
    }
    OR_ASSERT_OK(orStreamSynchronize(stream));
    ASSERT_EQ(static_cast<size_t>(kSteps), log.size());
    for (int i = 0; i < kSteps; ++i) EXPECT_EQ(i, log[i]);
  }
}

// Attributes describe a kernel; they never change where or in what order it
// runs.
TEST_F(StreamTest, KernelsLaunchedWithAttributesRunInLaunchOrder) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  std::vector<int> log;
  std::vector<Step> steps;
  for (int i = 0; i < 8; ++i) steps.push_back({&log, i});
  orLaunchAttributes attrs[3] = {};
  attrs[1].hostThreads = 1;
  attrs[2].hostThreads = 4;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i % 4 == 3) {
      OR_ASSERT_OK(orLaunchKernel(stream.get(), RecordStep, &steps[i]));
    } else if (i % 4 == 2) {
      OR_ASSERT_OK(
          orLaunchKernelEx(stream.get(), RecordStep, &steps[i], nullptr));
    } else {
      OR_ASSERT_OK(orLaunchKernelEx(stream.get(), RecordStep, &steps[i],
                                    &attrs[(i / 4 + i) % 3]));
    }
  }
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}), log);
}

int ReportDevice(void* out) {
  return orGetDevice(static_cast<int*>(out)) == orSuccess ? 0 : 1;
}

TEST_F(StreamTest, KernelsRunWithTheStreamsDeviceCurrent) {
  OR_REQUIRE_HOST_KERNELS();
  const int count = DeviceCount();
  for (int d = 0; d < count; ++d) {
    SCOPED_TRACE(d);
    OR_ASSERT_OK(orSetDevice(d));
    StreamHandle stream;
    OR_ASSERT_OK(orSetDevice(0));
    int seen = -1;
    OR_ASSERT_OK(orLaunchKernel(stream.get(), ReportDevice, &seen));
    OR_ASSERT_OK(orStreamSynchronize(stream.get()));
    EXPECT_EQ(d, seen);
  }
}

TEST_F(StreamTest, QueryReportsRunningWorkUntilItFinishes) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  // The kernel has left the queue and is running: the queue is empty but
  // the work has not finished.
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  gate.Open();
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  OR_EXPECT_OK(orStreamQuery(stream.get()));
}

TEST_F(StreamTest, QueryOnDefaultStream) {
  OR_REQUIRE_HOST_KERNELS();
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(nullptr, Gate::Kernel, &gate));
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orStreamQuery(nullptr));
  // Another stream of the same device is independent.
  StreamHandle other;
  OR_EXPECT_OK(orStreamQuery(other.get()));
  gate.Open();
  OR_ASSERT_OK(orStreamSynchronize(nullptr));
  OR_EXPECT_OK(orStreamQuery(nullptr));
}

TEST_F(StreamTest, LaunchFailureIsReportedOnceBySynchronize) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  std::vector<int> log;
  Step after{&log, 7};
  OR_ASSERT_OK(orLaunchKernel(stream.get(), FailingKernel, nullptr));
  OR_ASSERT_OK(orLaunchKernel(stream.get(), FailingKernel, nullptr));
  // Work after a failed kernel still runs.
  OR_ASSERT_OK(orLaunchKernel(stream.get(), RecordStep, &after));
  EXPECT_EQ(orErrorLaunchFailure, orStreamSynchronize(stream.get()));
  EXPECT_EQ(std::vector<int>{7}, log);
  // The error was cleared by the synchronize that reported it.
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));
  OR_EXPECT_OK(orStreamQuery(stream.get()));

  // And a later failure is reported again.
  OR_ASSERT_OK(orLaunchKernel(stream.get(), FailingKernel, nullptr));
  EXPECT_EQ(orErrorLaunchFailure, orStreamSynchronize(stream.get()));
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));
}

TEST_F(StreamTest, DeviceSynchronizeWaitsForEveryStream) {
  OR_REQUIRE_HOST_KERNELS();
  const int kStreams = 3;
  std::vector<std::unique_ptr<StreamHandle>> streams;
  std::atomic<bool> flags[kStreams + 1] = {};
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<StreamHandle>());
    OR_ASSERT_OK(orLaunchKernel(streams.back()->get(), SetFlag, &flags[i]));
  }
  OR_ASSERT_OK(orLaunchKernel(nullptr, SetFlag, &flags[kStreams]));
  OR_ASSERT_OK(orDeviceSynchronize());
  for (int i = 0; i <= kStreams; ++i) {
    EXPECT_TRUE(flags[i].load()) << "stream " << i;
  }
  for (auto& s : streams) OR_EXPECT_OK(orStreamQuery(s->get()));
}

TEST_F(StreamTest, DeviceSynchronizeReportsAndClearsKernelFailures) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), FailingKernel, nullptr));
  EXPECT_EQ(orErrorLaunchFailure, orDeviceSynchronize());
  OR_EXPECT_OK(orDeviceSynchronize());
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));

  OR_ASSERT_OK(orLaunchKernel(nullptr, FailingKernel, nullptr));
  EXPECT_EQ(orErrorLaunchFailure, orDeviceSynchronize());
  OR_EXPECT_OK(orStreamSynchronize(nullptr));
}

TEST_F(StreamTest, DeviceSynchronizeIsPerDevice) {
  OR_REQUIRE_HOST_KERNELS();
  OR_REQUIRE_DEVICES(2);
  orStream_t def1 = nullptr;
  OR_ASSERT_OK(orDeviceGetDefaultStream(1, &def1));
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(def1, Gate::Kernel, &gate));
  OR_ASSERT_OK(orLaunchKernel(def1, FailingKernel, nullptr));
  gate.WaitEntered();
  // Device 0 neither waits for device 1's blocked stream (the call would
  // hang) nor reports its failure.
  OR_EXPECT_OK(orDeviceSynchronize());
  gate.Open();
  OR_ASSERT_OK(orSetDevice(1));
  EXPECT_EQ(orErrorLaunchFailure, orDeviceSynchronize());
  OR_EXPECT_OK(orDeviceSynchronize());
}

// cudaStreamDestroy's model: the call returns at once, the queued work
// still runs, and the device's synchronization waits for it.
TEST_F(StreamTest, DestroyReturnsAtOnceAndTheQueuedWorkStillRuns) {
  OR_REQUIRE_HOST_KERNELS();
  Gate gate;
  std::atomic<bool> done{false};
  orStream_t stream = nullptr;
  OR_ASSERT_OK(orStreamCreate(&stream));
  OR_ASSERT_OK(orLaunchKernel(stream, Gate::Kernel, &gate));
  OR_ASSERT_OK(orLaunchKernel(stream, SetFlag, &done));
  gate.WaitEntered();
  OR_ASSERT_OK(orStreamDestroy(stream));  // the gate is still closed
  EXPECT_FALSE(done.load());
  gate.Open();
  OR_ASSERT_OK(orDeviceSynchronize());
  EXPECT_TRUE(done.load());
  // Streams made and destroyed with work queued are freed as they drain.
  for (int i = 0; i < 64; ++i) {
    OR_ASSERT_OK(orStreamCreate(&stream));
    OR_ASSERT_OK(orLaunchKernel(stream, SetFlag, &done));
    OR_ASSERT_OK(orStreamDestroy(stream));
  }
  OR_ASSERT_OK(orDeviceSynchronize());
}

// The failure of a destroyed stream's work is the next device
// synchronization's, once.
TEST_F(StreamTest, AFailureAfterDestroyIsTheDeviceSynchronizations) {
  OR_REQUIRE_HOST_KERNELS();
  Gate gate;
  orStream_t stream = nullptr;
  OR_ASSERT_OK(orStreamCreate(&stream));
  OR_ASSERT_OK(orLaunchKernel(stream, Gate::Kernel, &gate));
  OR_ASSERT_OK(orLaunchKernel(stream, FailingKernel, nullptr));
  gate.WaitEntered();
  OR_ASSERT_OK(orStreamDestroy(stream));
  gate.Open();
  EXPECT_EQ(orErrorLaunchFailure, orDeviceSynchronize());
  OR_EXPECT_OK(orDeviceSynchronize());
  // Also when the stream was freed first, by a later creation.
  orEvent_t drained = nullptr;
  OR_ASSERT_OK(orEventCreate(&drained));
  OR_ASSERT_OK(orStreamCreate(&stream));
  OR_ASSERT_OK(orLaunchKernel(stream, FailingKernel, nullptr));
  OR_ASSERT_OK(orEventRecord(drained, stream));
  OR_ASSERT_OK(orStreamDestroy(stream));
  (void)orEventSynchronize(drained);  // the stream has drained
  OR_ASSERT_OK(orEventDestroy(drained));
  orStream_t later = nullptr;
  OR_ASSERT_OK(orStreamCreate(&later));  // frees the drained stream
  OR_ASSERT_OK(orStreamDestroy(later));
  EXPECT_EQ(orErrorLaunchFailure, orDeviceSynchronize());
  OR_EXPECT_OK(orDeviceSynchronize());
}

TEST_F(StreamTest, ManyStreamsCreatedAndDestroyed) {
  OR_REQUIRE_HOST_KERNELS();
  std::vector<orStream_t> streams(32, nullptr);
  for (auto& s : streams) OR_ASSERT_OK(orStreamCreate(&s));
  std::atomic<int> counter{0};
  for (auto& s : streams) {
    OR_ASSERT_OK(orLaunchKernel(
        s,
        [](void* c) {
          static_cast<std::atomic<int>*>(c)->fetch_add(1);
          return 0;
        },
        &counter));
  }
  OR_ASSERT_OK(orDeviceSynchronize());
  EXPECT_EQ(32, counter.load());
  for (auto& s : streams) OR_ASSERT_OK(orStreamDestroy(s));
}

// Many threads launching onto one shared stream and onto their own streams.
struct Tagged {
  std::vector<std::pair<int, int>>* log;  // (thread, sequence)
  int* plain_counter;                     // only touched by kernels
  int thread;
  int seq;
};

int RecordTagged(void* arg) {
  auto* t = static_cast<Tagged*>(arg);
  t->log->emplace_back(t->thread, t->seq);
  ++*t->plain_counter;  // a data race unless kernels of a stream serialise
  return 0;
}

TEST_F(StreamTest, ConcurrentLaunchesFromManyThreads) {
  OR_REQUIRE_HOST_KERNELS();
  // 4 x 1000 launches on the shared stream: more than a launch queue of
  // finite capacity holds, so producers also meet a full queue.
  const int kThreads = 4;
  const int kPerThread = 1000;
  StreamHandle shared;
  std::vector<std::pair<int, int>> shared_log;
  int shared_counter = 0;
  std::vector<std::vector<Tagged>> args(kThreads);
  std::vector<std::vector<std::pair<int, int>>> own_logs(kThreads);
  std::vector<int> own_counters(kThreads, 0);
  std::vector<std::vector<Tagged>> own_args(kThreads);
  std::atomic<int> failures{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    args[t].reserve(kPerThread);
    own_args[t].reserve(kPerThread);
    for (int i = 0; i < kPerThread; ++i) {
      args[t].push_back({&shared_log, &shared_counter, t, i});
      own_args[t].push_back({&own_logs[t], &own_counters[t], t, i});
    }
  }
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      orStream_t own = nullptr;
      if (orStreamCreate(&own) != orSuccess) {
        ++failures;
        return;
      }
      for (int i = 0; i < kPerThread; ++i) {
        if (orLaunchKernel(shared.get(), RecordTagged, &args[t][i]) !=
                orSuccess ||
            orLaunchKernel(own, RecordTagged, &own_args[t][i]) != orSuccess) {
          ++failures;
        }
      }
      if (orStreamSynchronize(own) != orSuccess) ++failures;
      if (orStreamDestroy(own) != orSuccess) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  OR_ASSERT_OK(orStreamSynchronize(shared.get()));
  ASSERT_EQ(0, failures.load());

  EXPECT_EQ(kThreads * kPerThread, shared_counter);
  ASSERT_EQ(static_cast<size_t>(kThreads * kPerThread), shared_log.size());
  // Each thread's launches ran in the order that thread issued them.
  std::vector<int> next(kThreads, 0);
  for (const auto& [thread, seq] : shared_log) {
    EXPECT_EQ(next[thread], seq) << "thread " << thread;
    next[thread] = seq + 1;
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(kPerThread, own_counters[t]);
    ASSERT_EQ(static_cast<size_t>(kPerThread), own_logs[t].size());
    for (int i = 0; i < kPerThread; ++i) {
      EXPECT_EQ(i, own_logs[t][i].second);
    }
  }
}

TEST_F(StreamTest, HostFarAheadOfABlockedStreamWaitsForRoomInOrder) {
  OR_REQUIRE_HOST_KERNELS();
  // The first kernel blocks; the host launches far more work than a launch
  // queue holds. A launch may block for room (CUDA's does), but nothing is
  // lost or reordered, and everything runs once the gate opens.
  StreamHandle stream;
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  const int kSteps = 5000;
  std::vector<int> log;
  std::vector<Step> steps;
  steps.reserve(kSteps);
  for (int i = 0; i < kSteps; ++i) steps.push_back({&log, i});
  std::thread opener([&] {
    gate.WaitEntered();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.Open();
  });
  int failed_launches = 0;
  for (auto& s : steps) {
    if (orLaunchKernel(stream.get(), RecordStep, &s) != orSuccess) {
      ++failed_launches;
    }
  }
  opener.join();
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  ASSERT_EQ(0, failed_launches);
  ASSERT_EQ(static_cast<size_t>(kSteps), log.size());
  for (int i = 0; i < kSteps; ++i) ASSERT_EQ(i, log[i]);
}

TEST_F(StreamTest, ManyThreadsSynchronizeAtDifferentPoints) {
  OR_REQUIRE_HOST_KERNELS();
  // Waiters with different targets: each returns once the work launched
  // before its call has finished, neither earlier nor never.
  StreamHandle stream;
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  const int kWaiters = 6;
  std::vector<std::atomic<bool>> flags(kWaiters);
  std::vector<std::thread> waiters;
  std::atomic<int> wrong{0};
  for (int w = 0; w < kWaiters; ++w) {
    OR_ASSERT_OK(orLaunchKernel(stream.get(), SetFlag, &flags[w]));
    waiters.emplace_back([&, w] {
      if (orStreamSynchronize(stream.get()) != orSuccess) ++wrong;
      for (int i = 0; i <= w; ++i) {
        if (!flags[i].load()) ++wrong;  // returned before its work ran
      }
    });
  }
  gate.Open();
  for (auto& th : waiters) th.join();
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  EXPECT_EQ(0, wrong.load());
}

TEST_F(StreamTest, StreamsOfOneDeviceRunConcurrently) {
  OR_REQUIRE_HOST_KERNELS();
  // Stream A blocks on a gate that only a kernel on stream B opens: this
  // completes only if the streams have independent workers.
  StreamHandle a;
  StreamHandle b;
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(a.get(), Gate::Kernel, &gate));
  OR_ASSERT_OK(orLaunchKernel(
      b.get(),
      [](void* g) {
        static_cast<Gate*>(g)->WaitEntered();
        static_cast<Gate*>(g)->Open();
        return 0;
      },
      &gate));
  OR_ASSERT_OK(orStreamSynchronize(a.get()));
  OR_ASSERT_OK(orStreamSynchronize(b.get()));
}

}  // namespace
