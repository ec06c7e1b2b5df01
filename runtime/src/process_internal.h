// The process driver's state in the user's process, shared by its two
// files: process_driver.cpp (starting and watching the device processes,
// requests, modules, loss) and process_queue.cpp (streams' command rings,
// launches, copies, the pinned pool, events). Nothing else includes it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "process_protocol.h"
#include "runtime_internal.h"

namespace openreg_rt {
namespace proc {

// The pinned pool: one memfd every device process maps.
struct PinnedPool {
  int fd = -1;
  char* base = nullptr;
  size_t capacity = 0;
  std::mutex mu;                  // guards the ranges
  std::map<size_t, size_t> free;  // offset -> size, coalesced
  std::map<size_t, size_t> live;  // offset -> size
  // Staging blocks of pageable copies kept for the next copy (guarded by
  // `mu`; "pageable-staging" in process_queue.cpp).
  std::vector<char*> staging;
};

// What all device processes share: the event table, the pinned pool, the
// names of the functions (by id, for error messages and loss reasons).
struct Shared {
  int events_fd = -1;
  openreg_proc::Events* events = nullptr;
  std::mutex events_mu;  // guards free_events and retiring_events
  std::vector<int> free_events;
  // Slots of destroyed events whose latest record may still be queued.
  struct RetiringEvent {
    int slot;
    const Device* dev;
    int ring;
    uint64_t ticket;
    uint64_t generation;
  };
  std::vector<RetiringEvent> retiring_events;
  PinnedPool pinned;
  std::mutex names_mu;  // guards function_names
  std::vector<std::string> function_names;
  std::atomic<int> next_module{0};
};

Shared& shared();

// One device process, seen from the user's process.
struct ProcessDevice {
  Device* dev = nullptr;
  int control_fd = -1;
  openreg_proc::Control* control = nullptr;
  pid_t pid = -1;
  std::thread watcher;    // spawned the process, waits for its end
  std::mutex request_mu;  // one request at a time
  std::mutex rings_mu;    // guards ring_used
  bool ring_used[openreg_proc::kMaxStreams] = {};
  std::mutex warnings_mu;  // one taker of the rings' warnings at a time
  std::atomic<bool> kill_requested{false};
  std::atomic<bool> reaped{false};  // the watcher has collected its status
  std::vector<int> arena_fds;       // every device's, passed to the process
};

inline ProcessDevice& of(const Device* dev) { return *dev->process; }

// Sends a request to the device process and waits for its answer;
// orErrorDeviceLost if the process ends first. `why`, if given, receives the
// answer's text (why a request failed).
orError_t request(ProcessDevice& pd, openreg_proc::Request what, int arg0,
                  int arg1, const char* text,
                  const uint64_t* values = nullptr,  // 3 of Control::value
                  std::string* why = nullptr);

// A request posted to one device process and answered later, so that a
// request every device must run (loading a kernel library: dlopen of
// libtorch, a few hundred milliseconds) runs on all of them at once. It
// holds the device's request lock from post() to wait() (or its end).
class PostedRequest {
 public:
  PostedRequest() = default;
  PostedRequest(PostedRequest&&) = default;
  PostedRequest& operator=(PostedRequest&&) = default;
  // Writes the request and rings the device's doorbell; the error of a lost
  // device is kept and returned by wait().
  void post(ProcessDevice& pd, openreg_proc::Request what, int arg0, int arg1,
            const char* text, const uint64_t* values = nullptr);
  // The device's answer (its text in `why`, if given).
  orError_t wait(std::string* why = nullptr);

 private:
  ProcessDevice* pd_ = nullptr;
  std::unique_lock<std::mutex> lock_;
  uint32_t seq_ = 0;
  orError_t posted_ = orSuccess;
};

}  // namespace proc
}  // namespace openreg_rt
