// Events: creation flags, record/query/synchronize, cross-stream ordering,
// elapsed time, and handle validation.
#include <atomic>
#include <chrono>
#include <thread>

#include "test_util.h"

namespace {

using openreg_test::DeviceBuffer;
using openreg_test::EventHandle;
using openreg_test::Gate;
using openreg_test::RuntimeTest;
using openreg_test::SleepKernel;
using openreg_test::StreamHandle;

class EventTest : public RuntimeTest {};

TEST_F(EventTest, CreateWithValidFlags) {
  for (unsigned int flags :
       {unsigned{orEventDefault}, unsigned{orEventDisableTiming}}) {
    SCOPED_TRACE(flags);
    orEvent_t event = nullptr;
    OR_ASSERT_OK(orEventCreateWithFlags(&event, flags));
    ASSERT_NE(nullptr, event);
    int device = -1;
    OR_ASSERT_OK(orEventGetDevice(event, &device));
    EXPECT_EQ(0, device);
    OR_ASSERT_OK(orEventDestroy(event));
  }
  orEvent_t event = nullptr;
  OR_ASSERT_OK(orEventCreate(&event));
  ASSERT_NE(nullptr, event);
  OR_ASSERT_OK(orEventDestroy(event));
}

TEST_F(EventTest, InvalidFlagsAreInvalidValue) {
  for (unsigned int flags : {1u, 3u, 4u, 6u, 0x100u, 0xffffffffu}) {
    SCOPED_TRACE(flags);
    orEvent_t event = reinterpret_cast<orEvent_t>(0x1);
    EXPECT_EQ(orErrorInvalidValue, orEventCreateWithFlags(&event, flags));
    EXPECT_EQ(nullptr, event);
  }
  EXPECT_EQ(orErrorInvalidValue, orEventCreateWithFlags(nullptr, 0));
  EXPECT_EQ(orErrorInvalidValue, orEventCreate(nullptr));
}

TEST_F(EventTest, EventBelongsToCurrentDevice) {
  OR_REQUIRE_DEVICES(2);
  OR_ASSERT_OK(orSetDevice(1));
  EventHandle event;
  OR_ASSERT_OK(orSetDevice(0));
  int device = -1;
  OR_ASSERT_OK(orEventGetDevice(event.get(), &device));
  EXPECT_EQ(1, device);
}

TEST_F(EventTest, NeverRecordedEventIsComplete) {
  EventHandle event;
  OR_EXPECT_OK(orEventQuery(event.get()));
  OR_EXPECT_OK(orEventSynchronize(event.get()));
}

TEST_F(EventTest, RecordQuerySynchronize) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  EventHandle event;
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  OR_ASSERT_OK(orEventRecord(event.get(), stream.get()));
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orEventQuery(event.get()));
  gate.Open();
  OR_ASSERT_OK(orEventSynchronize(event.get()));
  OR_EXPECT_OK(orEventQuery(event.get()));
  OR_EXPECT_OK(orStreamQuery(stream.get()));
}

TEST_F(EventTest, RecordOnDefaultStream) {
  OR_REQUIRE_HOST_KERNELS();
  EventHandle event;
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(nullptr, Gate::Kernel, &gate));
  OR_ASSERT_OK(orEventRecord(event.get(), nullptr));
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orEventQuery(event.get()));
  gate.Open();
  OR_ASSERT_OK(orEventSynchronize(event.get()));
  OR_EXPECT_OK(orEventQuery(event.get()));
}

TEST_F(EventTest, CompletedEventImpliesIdleStreamAndViceVersa) {
  // Once the last work of a stream is an event record, "the event has
  // completed" and "the stream has finished" must agree, whichever of the
  // two a thread waits for.
  StreamHandle stream;
  EventHandle event;
  for (int i = 0; i < 300; ++i) {
    OR_ASSERT_OK(orEventRecord(event.get(), stream.get()));
    if (i % 2 == 0) {
      OR_ASSERT_OK(orEventSynchronize(event.get()));
      ASSERT_EQ(orSuccess, orStreamQuery(stream.get())) << "iteration " << i;
    } else {
      OR_ASSERT_OK(orStreamSynchronize(stream.get()));
      ASSERT_EQ(orSuccess, orEventQuery(event.get())) << "iteration " << i;
    }
  }
}

TEST_F(EventTest, AStreamThatWaitedForAnEventFindsTheRecordingStreamDone) {
  // Whether the wait was queued or the event had already completed when it
  // was asked for, a stream that passed it has seen the record, so the
  // recording stream is done up to it: its query agrees (a device process
  // once signalled the event before it counted the stream's command).
  StreamHandle a;
  StreamHandle b;
  EventHandle event(orEventDisableTiming);
  for (int i = 0; i < 300; ++i) {
    OR_ASSERT_OK(orEventRecord(event.get(), a.get()));
    OR_ASSERT_OK(orStreamWaitEvent(b.get(), event.get()));
    OR_ASSERT_OK(orStreamSynchronize(b.get()));
    ASSERT_EQ(orSuccess, orStreamQuery(a.get())) << "iteration " << i;
  }
}

TEST_F(EventTest, ReRecordingTracksTheLatestRecord) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  EventHandle event;
  OR_ASSERT_OK(orEventRecord(event.get(), stream.get()));
  OR_ASSERT_OK(orEventSynchronize(event.get()));
  OR_EXPECT_OK(orEventQuery(event.get()));

  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  OR_ASSERT_OK(orEventRecord(event.get(), stream.get()));
  gate.WaitEntered();
  // The new record is pending even though an earlier one completed.
  EXPECT_EQ(orErrorNotReady, orEventQuery(event.get()));
  gate.Open();
  OR_ASSERT_OK(orEventSynchronize(event.get()));
  OR_EXPECT_OK(orEventQuery(event.get()));
}

// Stream A: a slow kernel produces a value. Stream B: waits for the event
// recorded after it, then consumes the value.
struct Handoff {
  int produced = 0;  // plain int: the event wait must order the accesses
  int observed = -1;
};

int Produce(void* arg) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  static_cast<Handoff*>(arg)->produced = 42;
  return 0;
}

int Consume(void* arg) {
  auto* h = static_cast<Handoff*>(arg);
  h->observed = h->produced;
  return 0;
}

TEST_F(EventTest, StreamWaitEventOrdersWorkAcrossStreams) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle a;
  StreamHandle b;
  EventHandle event(orEventDisableTiming);
  Handoff h;
  OR_ASSERT_OK(orLaunchKernel(a.get(), Produce, &h));
  OR_ASSERT_OK(orEventRecord(event.get(), a.get()));
  OR_ASSERT_OK(orStreamWaitEvent(b.get(), event.get()));
  OR_ASSERT_OK(orLaunchKernel(b.get(), Consume, &h));
  OR_ASSERT_OK(orStreamSynchronize(b.get()));
  EXPECT_EQ(42, h.observed);
  OR_ASSERT_OK(orStreamSynchronize(a.get()));
}

TEST_F(EventTest, StreamWaitEventBlocksUntilTheRecordCompletes) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle a;
  StreamHandle b;
  EventHandle event;
  Gate gate;
  std::atomic<bool> ran{false};
  OR_ASSERT_OK(orLaunchKernel(a.get(), Gate::Kernel, &gate));
  OR_ASSERT_OK(orEventRecord(event.get(), a.get()));
  OR_ASSERT_OK(orStreamWaitEvent(b.get(), event.get()));
  OR_ASSERT_OK(orLaunchKernel(
      b.get(),
      [](void* r) {
        static_cast<std::atomic<bool>*>(r)->store(true);
        return 0;
      },
      &ran));
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orStreamQuery(b.get()));
  EXPECT_FALSE(ran.load());
  gate.Open();
  OR_ASSERT_OK(orStreamSynchronize(b.get()));
  EXPECT_TRUE(ran.load());
}

TEST_F(EventTest, StreamWaitEventAcrossDevices) {
  OR_REQUIRE_HOST_KERNELS();
  OR_REQUIRE_DEVICES(2);
  OR_ASSERT_OK(orSetDevice(1));
  StreamHandle a;  // device 1
  EventHandle event;
  OR_ASSERT_OK(orSetDevice(0));
  StreamHandle b;  // device 0
  Handoff h;
  OR_ASSERT_OK(orLaunchKernel(a.get(), Produce, &h));
  OR_ASSERT_OK(orEventRecord(event.get(), a.get()));
  OR_ASSERT_OK(orStreamWaitEvent(b.get(), event.get()));
  OR_ASSERT_OK(orLaunchKernel(b.get(), Consume, &h));
  OR_ASSERT_OK(orStreamSynchronize(b.get()));
  EXPECT_EQ(42, h.observed);
  OR_ASSERT_OK(orStreamSynchronize(a.get()));
}

TEST_F(EventTest, WaitOnNeverRecordedEventIsNoOp) {
  StreamHandle stream;
  EventHandle event;
  OR_ASSERT_OK(orStreamWaitEvent(stream.get(), event.get()));
  OR_ASSERT_OK(orStreamWaitEvent(nullptr, event.get()));
  OR_EXPECT_OK(orStreamSynchronize(stream.get()));
}

TEST_F(EventTest, WaitUsesTheRecordCurrentAtCallTime) {
  OR_REQUIRE_HOST_KERNELS();
  // The event is recorded on A (blocked), B waits for that record, then the
  // event is recorded again on the idle stream C. B must keep waiting for
  // A's record, not be released by C's newer one.
  StreamHandle a;
  StreamHandle b;
  StreamHandle c;
  EventHandle event;
  Gate gate;
  std::atomic<bool> ran{false};
  OR_ASSERT_OK(orLaunchKernel(a.get(), Gate::Kernel, &gate));
  OR_ASSERT_OK(orEventRecord(event.get(), a.get()));
  OR_ASSERT_OK(orStreamWaitEvent(b.get(), event.get()));
  OR_ASSERT_OK(orLaunchKernel(
      b.get(),
      [](void* r) {
        static_cast<std::atomic<bool>*>(r)->store(true);
        return 0;
      },
      &ran));
  OR_ASSERT_OK(orEventRecord(event.get(), c.get()));
  OR_ASSERT_OK(orStreamSynchronize(c.get()));
  gate.WaitEntered();
  // The latest record (on C) has completed.
  OR_EXPECT_OK(orEventQuery(event.get()));
  // Give a wrongly released B time to run.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(orErrorNotReady, orStreamQuery(b.get()));
  gate.Open();
  OR_ASSERT_OK(orStreamSynchronize(b.get()));
  EXPECT_TRUE(ran.load());
}

TEST_F(EventTest, ElapsedTimeAroundASleepingKernel) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  EventHandle start;
  EventHandle end;
  int ms = 20;
  OR_ASSERT_OK(orEventRecord(start.get(), stream.get()));
  OR_ASSERT_OK(orLaunchKernel(stream.get(), SleepKernel, &ms));
  OR_ASSERT_OK(orEventRecord(end.get(), stream.get()));
  OR_ASSERT_OK(orEventSynchronize(end.get()));
  float elapsed = -1.0f;
  OR_ASSERT_OK(orEventElapsedTime(&elapsed, start.get(), end.get()));
  EXPECT_GE(elapsed, 15.0f);
  EXPECT_LT(elapsed, 2000.0f);

  // An event against itself is zero.
  OR_ASSERT_OK(orEventElapsedTime(&elapsed, start.get(), start.get()));
  EXPECT_EQ(0.0f, elapsed);
}

TEST_F(EventTest, ElapsedTimeNeedsTiming) {
  StreamHandle stream;
  EventHandle timed;
  EventHandle untimed(orEventDisableTiming);
  OR_ASSERT_OK(orEventRecord(timed.get(), stream.get()));
  OR_ASSERT_OK(orEventRecord(untimed.get(), stream.get()));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  float ms = -1.0f;
  EXPECT_EQ(orErrorInvalidEventTiming,
            orEventElapsedTime(&ms, timed.get(), untimed.get()));
  EXPECT_EQ(orErrorInvalidEventTiming,
            orEventElapsedTime(&ms, untimed.get(), timed.get()));
  EXPECT_EQ(orErrorInvalidEventTiming,
            orEventElapsedTime(&ms, untimed.get(), untimed.get()));
}

TEST_F(EventTest, ElapsedTimeNeedsRecordedEvents) {
  StreamHandle stream;
  EventHandle recorded;
  EventHandle never;
  OR_ASSERT_OK(orEventRecord(recorded.get(), stream.get()));
  OR_ASSERT_OK(orEventSynchronize(recorded.get()));
  float ms = -1.0f;
  EXPECT_EQ(orErrorInvalidEventTiming,
            orEventElapsedTime(&ms, recorded.get(), never.get()));
  EXPECT_EQ(orErrorInvalidEventTiming,
            orEventElapsedTime(&ms, never.get(), recorded.get()));
  EXPECT_EQ(orErrorInvalidEventTiming,
            orEventElapsedTime(&ms, never.get(), never.get()));
}

TEST_F(EventTest, ElapsedTimeOfPendingEventIsNotReady) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  EventHandle start;
  EventHandle end;
  Gate gate;
  OR_ASSERT_OK(orEventRecord(start.get(), stream.get()));
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  OR_ASSERT_OK(orEventRecord(end.get(), stream.get()));
  gate.WaitEntered();
  float ms = -1.0f;
  EXPECT_EQ(orErrorNotReady, orEventElapsedTime(&ms, start.get(), end.get()));
  gate.Open();
  OR_ASSERT_OK(orEventSynchronize(end.get()));
  OR_EXPECT_OK(orEventElapsedTime(&ms, start.get(), end.get()));
  EXPECT_GE(ms, 0.0f);
}

TEST_F(EventTest, RecordOnStreamOfAnotherDeviceIsInvalidHandle) {
  OR_REQUIRE_DEVICES(2);
  EventHandle event;  // device 0
  OR_ASSERT_OK(orSetDevice(1));
  StreamHandle stream;  // device 1
  EXPECT_EQ(orErrorInvalidResourceHandle,
            orEventRecord(event.get(), stream.get()));
  // NULL means device 1's default stream here: also the wrong device.
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventRecord(event.get(), nullptr));
  orStream_t def1 = nullptr;
  OR_ASSERT_OK(orDeviceGetDefaultStream(1, &def1));
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventRecord(event.get(), def1));
  // The failed records left the event unrecorded.
  OR_EXPECT_OK(orEventQuery(event.get()));
  float ms = 0;
  EXPECT_EQ(orErrorInvalidEventTiming,
            orEventElapsedTime(&ms, event.get(), event.get()));
  // With device 0 current, NULL is device 0's default stream: fine.
  OR_ASSERT_OK(orSetDevice(0));
  OR_EXPECT_OK(orEventRecord(event.get(), nullptr));
  OR_EXPECT_OK(orEventSynchronize(event.get()));
}

TEST_F(EventTest, NullHandles) {
  EventHandle event;
  StreamHandle stream;
  float ms = 0;
  int device = 0;
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventDestroy(nullptr));
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventRecord(nullptr, nullptr));
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventRecord(nullptr, stream.get()));
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventQuery(nullptr));
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventSynchronize(nullptr));
  EXPECT_EQ(orErrorInvalidResourceHandle,
            orStreamWaitEvent(stream.get(), nullptr));
  EXPECT_EQ(orErrorInvalidResourceHandle, orStreamWaitEvent(nullptr, nullptr));
  EXPECT_EQ(orErrorInvalidResourceHandle,
            orEventElapsedTime(&ms, nullptr, event.get()));
  EXPECT_EQ(orErrorInvalidResourceHandle,
            orEventElapsedTime(&ms, event.get(), nullptr));
  EXPECT_EQ(orErrorInvalidValue,
            orEventElapsedTime(nullptr, event.get(), event.get()));
  EXPECT_EQ(orErrorInvalidResourceHandle, orEventGetDevice(nullptr, &device));
  EXPECT_EQ(orErrorInvalidValue, orEventGetDevice(event.get(), nullptr));
}

TEST_F(EventTest, DestroyWithRecordStillPending) {
  OR_REQUIRE_HOST_KERNELS();
  StreamHandle stream;
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  orEvent_t event = nullptr;
  OR_ASSERT_OK(orEventCreate(&event));
  OR_ASSERT_OK(orEventRecord(event, stream.get()));
  OR_ASSERT_OK(orEventDestroy(event));  // the queued record outlives it
  gate.Open();
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
}

// orStreamWaitValue32 / orHostWriteValue32: a stream waits on a word in
// pinned host memory that the host sets (cuStreamWaitValue32's model). Only
// copies and memsets run on the stream, so every driver runs these.
class StreamValueTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    ASSERT_EQ(orSuccess, orMallocHost(&pinned_, 64));
    word_ = static_cast<uint32_t*>(pinned_);
    out_ = word_ + 1;
    *word_ = 0;
    *out_ = 0;
    OR_ASSERT_OK(orMemset(sevens_.get(), 7, sizeof(uint32_t)));
  }
  void TearDown() override {
    EXPECT_EQ(orSuccess, orFreeHost(pinned_));
    RuntimeTest::TearDown();
  }
  // Queues on `stream` a copy of 0x07070707 from the device into out_.
  void QueueCopyOfSevens(orStream_t stream) {
    OR_ASSERT_OK(orMemcpyAsync(out_, sevens_.get(), sizeof(uint32_t),
                               orMemcpyDeviceToHost, stream));
  }

  char* pinned_bytes() const { return static_cast<char*>(pinned_); }

  void* pinned_ = nullptr;
  uint32_t* word_ = nullptr;
  uint32_t* out_ = nullptr;
  DeviceBuffer sevens_{sizeof(uint32_t)};
};

TEST_F(StreamValueTest, WorkAfterTheWaitRunsOnceTheHostWritesTheValue) {
  StreamHandle stream;
  OR_ASSERT_OK(orStreamWaitValue32(stream.get(), word_, 3, 0));
  QueueCopyOfSevens(stream.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  EXPECT_EQ(0u, __atomic_load_n(out_, __ATOMIC_ACQUIRE));
  OR_ASSERT_OK(orHostWriteValue32(word_, 2));  // below 3: still waiting
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  OR_ASSERT_OK(orHostWriteValue32(word_, 3));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  EXPECT_EQ(0x07070707u, *out_);
}

TEST_F(StreamValueTest, APlainStoreReleasesTheDefaultStreamToo) {
  OR_ASSERT_OK(orStreamWaitValue32(nullptr, word_, 1, 0));
  QueueCopyOfSevens(nullptr);
  __atomic_store_n(word_, 5u, __ATOMIC_RELEASE);  // at least 1
  OR_ASSERT_OK(orDeviceSynchronize());
  EXPECT_EQ(0x07070707u, *out_);
}

// A stream destroyed while it waits returns at once (cudaStreamDestroy);
// its work runs when the value comes, and the device's synchronization
// waits for it.
TEST_F(StreamValueTest, DestroyingAWaitingStreamReturnsAtOnce) {
  orStream_t stream = nullptr;
  OR_ASSERT_OK(orStreamCreate(&stream));
  OR_ASSERT_OK(orStreamWaitValue32(stream, word_, 1, 0));
  QueueCopyOfSevens(stream);
  OR_ASSERT_OK(orStreamDestroy(stream));
  EXPECT_EQ(0u, __atomic_load_n(out_, __ATOMIC_ACQUIRE));
  OR_ASSERT_OK(orHostWriteValue32(word_, 1));
  OR_ASSERT_OK(orDeviceSynchronize());
  EXPECT_EQ(0x07070707u, *out_);
}

TEST_F(StreamValueTest, AtLeastIsModulo2To32) {
  StreamHandle stream;
  // 0 is 16 past 0xfffffff0 (a counter that wrapped): satisfied at once.
  OR_ASSERT_OK(orStreamWaitValue32(stream.get(), word_, 0xfffffff0u, 0));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  // 0x80000000 is at least 1 (the difference 0x7fffffff is positive as an
  // int32), and not at least 0x80000001 (-1).
  OR_ASSERT_OK(orHostWriteValue32(word_, 0x80000000u));
  OR_ASSERT_OK(orStreamWaitValue32(stream.get(), word_, 1, 0));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  OR_ASSERT_OK(orStreamWaitValue32(stream.get(), word_, 0x80000001u, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  OR_ASSERT_OK(orHostWriteValue32(word_, 0x80000001u));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
}

TEST_F(StreamValueTest, AWordOutsidePinnedMemoryOrAFlagIsInvalidValue) {
  uint32_t pageable = 0;
  DeviceBuffer device(sizeof(uint32_t));
  for (void* bad : {static_cast<void*>(nullptr), static_cast<void*>(&pageable),
                    device.get(), static_cast<void*>(pinned_bytes() + 1)}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(orErrorInvalidValue, orStreamWaitValue32(nullptr, bad, 1, 0));
    EXPECT_EQ(orErrorInvalidValue, orHostWriteValue32(bad, 1));
  }
  EXPECT_EQ(orErrorInvalidValue, orStreamWaitValue32(nullptr, word_, 1, 1));
  EXPECT_EQ(0u, *word_);
}

}  // namespace
