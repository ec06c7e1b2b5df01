// Internal state of the simulated device. Nothing outside runtime/src may
// include this file: the public surface is include/openreg.h.
#pragma once

#include <openreg.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

struct orStream;

namespace openreg_rt {

// Alignment of every device allocation (the address and the rounded size).
constexpr size_t kAllocAlignment = 512;

using Stream = ::orStream;

// One simulated device and its memory arena.
//
// The arena is one anonymous shared file (memfd) of `capacity` bytes mapped
// twice: `device_base` with PROT_NONE (the addresses handed out as device
// pointers; a host access faults) and `kernel_base` read-write (the addresses
// kernels use). device pointer p and kernel pointer p - device_base +
// kernel_base name the same byte. Immutable after construction except where
// noted.
struct Device {
  int index = 0;
  size_t capacity = 0;
  int fd = -1;
  char* device_base = nullptr;
  char* kernel_base = nullptr;

  std::mutex mem_mutex;                  // guards the three fields below
  std::map<size_t, size_t> live;         // offset -> size of live blocks
  std::map<size_t, size_t> free_ranges;  // offset -> size, coalesced
  size_t used = 0;                       // bytes in live blocks

  std::mutex streams_mutex;          // guards `streams`
  std::set<Stream*> streams;         // every live stream of the device
  Stream* default_stream = nullptr;  // created with the device, never freed

  bool contains(const void* p) const {
    auto c = static_cast<const char*>(p);
    return c >= device_base && c < device_base + capacity;
  }
};

struct Runtime {
  std::vector<std::unique_ptr<Device>> devices;
  size_t capacity = 0;
};

// Set in a forked child of a process that initialised the runtime.
extern std::atomic<bool> g_forked;

// Initialises the runtime once; returns orSuccess or why it failed. Checks the
// fork flag first, so every API entry point calls this before anything else.
orError_t ensure_init();
// Valid only after ensure_init() returned orSuccess.
Runtime& runtime();
// Device by ordinal, or nullptr when out of range (after ensure_init).
Device* device_at(int index);
// The device whose address range contains p, or nullptr.
Device* device_of(const void* p);
int current_device();

// Memory helpers shared by memcpy and streams.
// Checks that [p, p + n) lies inside one live allocation of dev.
bool range_is_live(Device& dev, const void* p, size_t n);
void* kernel_ptr(Device& dev, const void* p);
bool host_range_is_pinned(const void* p, size_t n);
// Fills attributes for a host pointer (pinned or not).
orError_t host_attributes(orPointerAttributes* attributes, const void* p);

// Installs the SIGSEGV/SIGBUS diagnostic (idempotent).
void install_fault_handler(const Runtime* rt);

}  // namespace openreg_rt

// An in-order work queue drained by one worker thread (started lazily).
struct orStream {
  using Device = openreg_rt::Device;

  orStream(Device* dev, int priority, bool is_default);
  ~orStream();
  orStream(const orStream&) = delete;
  orStream& operator=(const orStream&) = delete;

  Device* device() const { return dev_; }
  int priority() const { return priority_; }
  bool is_default() const { return is_default_; }

  // Appends work; returns at once.
  void enqueue(std::function<void()> task);
  // Appends a marker (an event record): when the worker reaches it, `signal`
  // runs under the stream's lock in the same step that counts it completed,
  // so "the event completed" and "the stream is idle" are never observed to
  // disagree. `signal` must be short and must not call into this stream.
  void enqueue_marker(std::function<void()> signal);
  // True once all work enqueued so far has finished.
  bool idle();
  // Blocks until all work enqueued before the call has finished, then returns
  // and clears the first error a task recorded.
  orError_t synchronize();
  // Called from tasks: remembers the first failure.
  void record_error(orError_t err);

  // private to stream.cpp:
  struct Task {
    std::function<void()> fn;
    bool marker;  // see enqueue_marker
  };
  void push(Task task);
  void run();

  Device* dev_;
  int priority_;
  bool is_default_;
  std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  orError_t error_ = orSuccess;
  bool stop_ = false;
  bool sleeping_ = false;            // the worker waits on work_cv_
  std::atomic<uint64_t> pushed_{0};  // tasks ever pushed (read lock-free)
  std::thread worker_;
};

#define OR_RETURN_IF_ERROR(expr) \
  do {                           \
    orError_t or_err_ = (expr);  \
    if (or_err_ != orSuccess) {  \
      return or_err_;            \
    }                            \
  } while (0)
