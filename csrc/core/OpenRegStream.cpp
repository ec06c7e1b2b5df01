#include "core/OpenRegStream.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegSynchronize.h"

namespace openreg {

namespace {

// As CUDA: every stream a program asks for comes from a fixed pool per
// device and priority, handed out round robin, so a program that creates
// streams in a loop does not grow (each runtime stream has a worker thread).
constexpr size_t kStreamsPerPool = 32;
constexpr size_t kMaxPriorities = 4;
// The reserved streams after the pools: the collective issue stream, then
// the completion streams.
constexpr size_t kReservedStreams = 1 + kCollectiveCompletionStreams;

// [doc:stream-table]
struct DeviceStreams {
  std::once_flag init_once;
  std::atomic<bool> ready{false};  // init_once has run (fast path)
  // table[id] is the runtime handle of stream id; table[0] is the default
  // stream. Filled once, under init_once; read without a lock afterwards.
  std::vector<orStream_t> table;
  int least = 0;     // numerically largest (lowest) priority
  int greatest = 0;  // numerically smallest (highest) priority
  // pools[p - greatest]: the ids of the pool of priority p.
  std::array<std::array<c10::StreamId, kStreamsPerPool>, kMaxPriorities>
      pools{};
  std::array<std::atomic<uint32_t>, kMaxPriorities> next{};
  // reserved: the ids of the reserved streams (priority 0, in no pool), in
  // the order of kReservedStreams.
  std::array<c10::StreamId, kReservedStreams> reserved{};
};

DeviceStreams& streams_of(c10::DeviceIndex device) {
  static std::array<DeviceStreams, kMaxDevices> all;
  check_device_index(device);
  DeviceStreams& ds = all[static_cast<size_t>(device)];
  if (C10_LIKELY(ds.ready.load(std::memory_order_acquire))) {
    return ds;
  }
  std::call_once(ds.init_once, [&ds, device] {
    lazy_init();
    orStream_t def = nullptr;
    OPENREG_CHECK(orDeviceGetDefaultStream(device, &def));
    OPENREG_CHECK(orDeviceGetStreamPriorityRange(&ds.least, &ds.greatest));
    TORCH_INTERNAL_ASSERT(
        ds.least >= ds.greatest &&
            static_cast<size_t>(ds.least - ds.greatest) < kMaxPriorities,
        "the driver reports stream priorities ", ds.greatest, "..", ds.least,
        "; at most ", kMaxPriorities, " levels are supported");
    ScopedDevice guard(device);
    ds.table.push_back(def);
    // Runtime streams are cheap until used: a worker starts on first work.
    for (int p = ds.greatest; p <= ds.least; ++p) {
      for (auto& id : ds.pools[static_cast<size_t>(p - ds.greatest)]) {
        orStream_t s = nullptr;
        OPENREG_CHECK(orStreamCreateWithPriority(&s, p));
        id = static_cast<c10::StreamId>(ds.table.size());
        ds.table.push_back(s);
      }
    }
    for (auto& id : ds.reserved) {
      orStream_t s = nullptr;
      OPENREG_CHECK(orStreamCreateWithPriority(&s, 0));
      id = static_cast<c10::StreamId>(ds.table.size());
      ds.table.push_back(s);
    }
    ds.ready.store(true, std::memory_order_release);
  });
  return ds;
}
// [/doc:stream-table]

c10::DeviceIndex resolve(c10::DeviceIndex device) {
  return device < 0 ? current_device() : device;
}

// [doc:stream-current]
// Current stream id per device on this thread (0: the default stream).
thread_local std::array<c10::StreamId, kMaxDevices> t_current{};
// [/doc:stream-current]

c10::Stream make(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

}  // namespace

orStream_t native_stream(const c10::Stream& stream) {
  TORCH_INTERNAL_ASSERT(stream.device_type() == c10::DeviceType::PrivateUse1);
  const DeviceStreams& ds = streams_of(stream.device_index());
  TORCH_CHECK(
      stream.id() >= 0 && static_cast<size_t>(stream.id()) < ds.table.size(),
      "Invalid openreg stream id ", stream.id(), " on device ",
      static_cast<int>(stream.device_index()), " (", ds.table.size(),
      " streams exist)");
  return ds.table[static_cast<size_t>(stream.id())];
}

c10::ArrayRef<orStream_t> device_streams(c10::DeviceIndex device) {
  return streams_of(resolve(device)).table;
}

OpenRegStream::OpenRegStream(c10::Stream stream) : stream_(stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "Expected an openreg stream, got a stream of ", stream.device());
}

orStream_t OpenRegStream::native() const { return native_stream(stream_); }

int OpenRegStream::priority() const {
  int priority = 0;
  OPENREG_CHECK(orStreamGetPriority(native(), &priority));
  return priority;
}

bool OpenRegStream::query() const {
  orError_t err = orStreamQuery(native());
  if (err == orErrorNotReady) {
    return false;
  }
  OPENREG_CHECK(err);
  return true;
}

void OpenRegStream::synchronize() const {
  synchronize_stream(native(), device_index(), id());
}

OpenRegStream getDefaultStream(c10::DeviceIndex device) {
  device = resolve(device);
  streams_of(device);
  return OpenRegStream(make(device, 0));
}

OpenRegStream getCurrentStream(c10::DeviceIndex device) {
  device = resolve(device);
  streams_of(device);
  return OpenRegStream(make(device, t_current[static_cast<size_t>(device)]));
}

// [doc:stream-api]
OpenRegStream getStreamFromPool(bool high_priority, c10::DeviceIndex device) {
  device = resolve(device);
  const DeviceStreams& ds = streams_of(device);
  return getNewStream(device, high_priority ? ds.greatest : ds.least);
}

OpenRegStream getNewStream(c10::DeviceIndex device, int priority) {
  device = resolve(device);
  DeviceStreams& ds = streams_of(device);
  priority = std::clamp(priority, ds.greatest, ds.least);
  const auto level = static_cast<size_t>(priority - ds.greatest);
  const uint32_t slot = ds.next[level].fetch_add(1) % kStreamsPerPool;
  return OpenRegStream(make(device, ds.pools[level][slot]));
}

OpenRegStream getReservedStream(c10::DeviceIndex device, ReservedStream which,
                                int index) {
  device = resolve(device);
  const DeviceStreams& ds = streams_of(device);
  const int count = which == ReservedStream::kCollectiveIssue
                        ? 1
                        : kCollectiveCompletionStreams;
  TORCH_INTERNAL_ASSERT(index >= 0 && index < count, "reserved stream ",
                        static_cast<int>(which), " has ", count,
                        " streams, asked for index ", index);
  const auto slot = static_cast<size_t>(
      which == ReservedStream::kCollectiveIssue ? 0 : 1 + index);
  return OpenRegStream(make(device, ds.reserved[slot]));
}

void setCurrentStream(OpenRegStream stream) {
  native_stream(stream.unwrap());  // validates the id
  t_current[static_cast<size_t>(stream.device_index())] = stream.id();
}
// [/doc:stream-api]

}  // namespace openreg
