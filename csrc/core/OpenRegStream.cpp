#include "core/OpenRegStream.h"

#include <array>
#include <atomic>
#include <deque>
#include <mutex>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegSynchronize.h"

namespace openreg {

namespace {

constexpr size_t kPoolSize = 4;  // streams per priority per device

// [doc:stream-table]
struct DeviceStreams {
  std::once_flag init_once;
  std::mutex mutex;  // guards `table`
  // table[id] is the runtime handle of stream id; table[0] is the default
  // stream. A deque keeps references stable while it grows.
  std::deque<orStream_t> table;
  std::array<c10::StreamId, kPoolSize> low_pool{};
  std::array<c10::StreamId, kPoolSize> high_pool{};
  std::atomic<uint32_t> low_next{0};
  std::atomic<uint32_t> high_next{0};
};

DeviceStreams& streams_of(c10::DeviceIndex device) {
  static std::array<DeviceStreams, kMaxDevices> all;
  check_device_index(device);
  DeviceStreams& ds = all[static_cast<size_t>(device)];
  std::call_once(ds.init_once, [&ds, device] {
    lazy_init();
    orStream_t def = nullptr;
    OPENREG_CHECK(orDeviceGetDefaultStream(device, &def));
    int least = 0;
    int greatest = 0;
    OPENREG_CHECK(orDeviceGetStreamPriorityRange(&least, &greatest));
    ScopedDevice guard(device);
    std::lock_guard<std::mutex> lock(ds.mutex);
    ds.table.push_back(def);
    for (auto [pool, priority] :
         {std::pair{&ds.low_pool, least}, std::pair{&ds.high_pool, greatest}}) {
      for (auto& id : *pool) {
        orStream_t s = nullptr;
        OPENREG_CHECK(orStreamCreateWithPriority(&s, priority));
        id = static_cast<c10::StreamId>(ds.table.size());
        ds.table.push_back(s);
      }
    }
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
  DeviceStreams& ds = streams_of(stream.device_index());
  std::lock_guard<std::mutex> lock(ds.mutex);
  TORCH_CHECK(
      stream.id() >= 0 && static_cast<size_t>(stream.id()) < ds.table.size(),
      "Invalid openreg stream id ", stream.id(), " on device ",
      static_cast<int>(stream.device_index()), " (", ds.table.size(),
      " streams exist)");
  return ds.table[static_cast<size_t>(stream.id())];
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
  DeviceStreams& ds = streams_of(device);
  auto& next = high_priority ? ds.high_next : ds.low_next;
  auto& pool = high_priority ? ds.high_pool : ds.low_pool;
  c10::StreamId id = pool[next.fetch_add(1) % kPoolSize];
  return OpenRegStream(make(device, id));
}

OpenRegStream getNewStream(c10::DeviceIndex device, int priority) {
  device = resolve(device);
  DeviceStreams& ds = streams_of(device);
  ScopedDevice guard(device);
  orStream_t s = nullptr;
  OPENREG_CHECK(orStreamCreateWithPriority(&s, priority));
  std::lock_guard<std::mutex> lock(ds.mutex);
  c10::StreamId id = static_cast<c10::StreamId>(ds.table.size());
  ds.table.push_back(s);
  return OpenRegStream(make(device, id));
}

void setCurrentStream(OpenRegStream stream) {
  native_stream(stream.unwrap());  // validates the id
  t_current[static_cast<size_t>(stream.device_index())] = stream.id();
}
// [/doc:stream-api]

}  // namespace openreg
