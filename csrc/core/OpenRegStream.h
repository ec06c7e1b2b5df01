// openreg streams as seen by PyTorch: c10::Stream ids mapped to runtime
// stream handles, a pool per device, and the thread-local current stream.
//
// Stream ids: 0 is the device's default stream; every other id indexes the
// device's table of runtime streams: a pool of 32 per priority level, made
// at initialisation and handed out round robin, as CUDA's stream pools are,
// then the streams openreg reserves for its own work (ReservedStream). A
// c10::Stream stays valid for the life of the process. Thread-safe.
#pragma once

#include <c10/core/Stream.h>
#include <c10/util/ArrayRef.h>
#include <openreg.h>

namespace openreg {

class OpenRegStream {
 public:
  explicit OpenRegStream(c10::Stream stream);

  c10::Stream unwrap() const { return stream_; }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::StreamId id() const { return stream_.id(); }
  // The runtime handle (never null).
  orStream_t native() const;
  int priority() const;
  // True once all work enqueued so far has finished.
  bool query() const;
  void synchronize() const;

 private:
  c10::Stream stream_;
};

OpenRegStream getDefaultStream(c10::DeviceIndex device = -1);
OpenRegStream getCurrentStream(c10::DeviceIndex device = -1);
// The next stream of the pool of the device's highest or lowest priority.
OpenRegStream getStreamFromPool(bool high_priority = false,
                                c10::DeviceIndex device = -1);
// The next stream of the pool of `priority` (clamped into the device's
// range): what torch.Stream() / torch.openreg.Stream() return.
OpenRegStream getNewStream(c10::DeviceIndex device, int priority);
// Streams a device keeps for openreg's own work, never handed out to
// programs (not in any pool): queues that must hold nothing but that work,
// such as the communication streams of collectives (distributed/), where a
// task waits for other processes. A device has one issue stream and
// kCollectiveCompletionStreams completion streams, which process groups take
// in turn (index: 0 .. count - 1).
enum class ReservedStream : int { kCollectiveIssue, kCollectiveCompletion };
constexpr int kCollectiveCompletionStreams = 8;
OpenRegStream getReservedStream(c10::DeviceIndex device, ReservedStream which,
                                int index = 0);
// Makes `stream` current for its device on this thread.
void setCurrentStream(OpenRegStream stream);
// The runtime handle behind a c10::Stream of type PrivateUse1.
orStream_t native_stream(const c10::Stream& stream);
// Every runtime stream of `device`, indexed by stream id (the default stream
// first): the PyTorch layer creates no other stream.
c10::ArrayRef<orStream_t> device_streams(c10::DeviceIndex device);

}  // namespace openreg
