// The process driver (OPENREG_DRIVER=process): each device is a process of
// its own (openreg-device, device_main.cpp), fed through shared memory
// (process_protocol.h). This file is the user process's side: starting the
// device processes, the rings of the streams, copies through the pinned
// pool, named kernels, events, and the watch that turns a device process's
// death into a lost device.
//
// What stays in the user's process: the device memory's bookkeeping
// (orMalloc/orFree, as a caching allocator would), the arenas' no-access
// views (addresses, the host-access diagnostic), pinned memory (a shared
// pool, so the device reads and writes it directly) and the event handles.
// The device process runs every copy, memset and kernel.
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "process_protocol.h"
#include "runtime_internal.h"

extern char** environ;

namespace openreg_rt {
namespace proc {

using namespace openreg_proc;

namespace {

using Clock = std::chrono::steady_clock;

void futex_wait(const void* word, uint32_t expected, long timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(const void* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Bytes of each pinned-pool staging chunk for copies from and to pageable
// host memory.
constexpr size_t kStagingBytes = size_t{4} << 20;

// The pinned pool: one memfd every device process maps.
struct PinnedPool {
  int fd = -1;
  char* base = nullptr;
  size_t capacity = 0;
  std::mutex mu;                  // guards the ranges
  std::map<size_t, size_t> free;  // offset -> size, coalesced
  std::map<size_t, size_t> live;  // offset -> size
};

struct Shared {
  int events_fd = -1;
  Events* events = nullptr;
  std::mutex events_mu;  // guards free_events
  std::vector<int> free_events;
  PinnedPool pinned;
  std::mutex names_mu;  // guards function_names
  std::vector<std::string> function_names;
  std::atomic<int> next_module{0};
};

Shared& shared() {
  static auto* s = new Shared();  // leaked: device processes outlive main()
  return *s;
}

}  // namespace

// One device process, seen from the user's process.
struct ProcessDevice {
  Device* dev = nullptr;
  int control_fd = -1;
  Control* control = nullptr;
  pid_t pid = -1;
  std::thread watcher;    // spawned the process, waits for its end
  std::mutex request_mu;  // one request at a time
  std::mutex rings_mu;    // guards ring_used
  bool ring_used[kMaxStreams] = {};
  std::atomic<bool> kill_requested{false};
  std::vector<int> arena_fds;  // every device's, passed to the process
};

namespace {

std::string executable_path() {
  if (const char* env = std::getenv("OPENREG_DEVICE_EXECUTABLE")) {
    return env;
  }
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&orInit), &info) != 0 &&
      info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) {
      return self.substr(0, slash + 1) + "openreg-device";
    }
  }
  return "openreg-device";
}

std::string describe_status(int status) {
  char text[128];
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    std::snprintf(text, sizeof(text), "signal %d (SIG%s)", sig,
                  name != nullptr ? name : "?");
  } else if (WIFEXITED(status)) {
    std::snprintf(text, sizeof(text), "exit code %d", WEXITSTATUS(status));
  } else {
    std::snprintf(text, sizeof(text), "status %d", status);
  }
  return text;
}

// Called by the watcher once the device process has ended.
void mark_lost(ProcessDevice& pd, int status) {
  Device* dev = pd.dev;
  std::string running;
  for (int r = 0; r < kMaxStreams; ++r) {
    const uint32_t id = pd.control->rings[r].running.load();
    if (id != 0) {
      std::lock_guard<std::mutex> lock(shared().names_mu);
      if (id - 1 < shared().function_names.size()) {
        running = shared().function_names[id - 1];
      }
      break;
    }
  }
  std::string reason = "device " + std::to_string(dev->index) +
                       " was lost: its process (pid " + std::to_string(pd.pid) +
                       ") ended with " + describe_status(status);
  if (!running.empty()) {
    reason += " while running kernel '" + running + "'";
  }
  {
    std::lock_guard<std::mutex> lock(dev->lost_mutex);
    if (!dev->lost.load()) {
      if (pd.kill_requested.load() && !dev->lost_reason.empty()) {
        reason = dev->lost_reason + " (" + reason + ")";
      }
      dev->lost_reason = reason;
    }
  }
  dev->lost.store(true, std::memory_order_release);
  // Whoever waits on this device wakes up and sees it lost; events it was
  // to record complete, so other devices' streams waiting on them go on.
  complete_events_of(dev);
  for (int r = 0; r < kMaxStreams; ++r) {
    futex_wake(&pd.control->rings[r].completed);
  }
  futex_wake(&pd.control->response_seq);
  futex_wake(&pd.control->ready);
}

// The watcher: spawns the device process from a thread that lives as long
// as the user's process (PR_SET_PDEATHSIG fires when the thread that
// spawned the child ends), then reaps it.
void watch(ProcessDevice* pd, std::promise<int> spawned) {
  const int count = static_cast<int>(pd->arena_fds.size());
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  std::vector<std::pair<int, int>> fds = {{pd->control_fd, kControlFd},
                                          {shared().events_fd, kEventsFd},
                                          {shared().pinned.fd, kPinnedFd}};
  for (int d = 0; d < count; ++d) {
    fds.emplace_back(pd->arena_fds[d], kFirstArenaFd + d);
  }
  // Two steps, because a source may already have a target's number: first
  // every file to a number above all sources, then down to its target;
  // then nothing else stays open in the child (a pipe the user's process
  // inherited, say, must not be held open by the device).
  int above = 0;
  for (auto [from, to] : fds) {
    above = std::max(above, std::max(from, to) + 1);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    posix_spawn_file_actions_adddup2(&actions, fds[i].first,
                                     above + static_cast<int>(i));
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    posix_spawn_file_actions_adddup2(&actions, above + static_cast<int>(i),
                                     fds[i].second);
  }
  posix_spawn_file_actions_addclosefrom_np(&actions, kFirstArenaFd + count);
  const std::string exe = executable_path();
  const std::string parent = std::to_string(getpid());
  char* argv[] = {const_cast<char*>(exe.c_str()),
                  const_cast<char*>(parent.c_str()), nullptr};
  pid_t pid = -1;
  const int err =
      posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    std::fprintf(stderr, "openreg: cannot start the device process %s: %s\n",
                 exe.c_str(), std::strerror(err));
    spawned.set_value(-1);
    return;
  }
  pd->pid = pid;
  spawned.set_value(pid);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  mark_lost(*pd, status);
}

orError_t request(ProcessDevice& pd, Request what, int arg0, int arg1,
                  const char* text) {
  std::lock_guard<std::mutex> lock(pd.request_mu);
  OR_RETURN_IF_ERROR(check_not_lost(pd.dev));
  Control& c = *pd.control;
  c.request = what;
  c.arg0 = arg0;
  c.arg1 = arg1;
  std::snprintf(c.text, sizeof(c.text), "%s", text != nullptr ? text : "");
  const uint32_t seq = c.request_seq.load() + 1;
  c.request_seq.store(seq, std::memory_order_seq_cst);
  futex_wake(&c.request_seq);
  for (;;) {
    const uint32_t done = c.response_seq.load(std::memory_order_acquire);
    if (done == seq) {
      return static_cast<orError_t>(c.status);
    }
    OR_RETURN_IF_ERROR(check_not_lost(pd.dev));
    futex_wait(&c.response_seq, done, 50);
  }
}

orError_t create_file(const char* name, size_t bytes, int* fd) {
  *fd = memfd_create(name, MFD_CLOEXEC);
  if (*fd < 0 || ftruncate(*fd, static_cast<off_t>(bytes)) != 0) {
    std::fprintf(stderr, "openreg: memfd for %s failed: %s\n", name,
                 std::strerror(errno));
    return orErrorInitializationError;
  }
  return orSuccess;
}

void* map_file(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

ProcessDevice& of(const Device* dev) { return *dev->process; }

}  // namespace

orError_t start(Runtime* rt, size_t pinned_capacity) {
  Shared& s = shared();
  const int count = static_cast<int>(rt->devices.size());
  if (count > kMaxDevices) {
    return orErrorInitializationError;
  }
  OR_RETURN_IF_ERROR(
      create_file("openreg-events", sizeof(Events), &s.events_fd));
  s.events = static_cast<Events*>(map_file(s.events_fd, sizeof(Events)));
  OR_RETURN_IF_ERROR(
      create_file("openreg-pinned", pinned_capacity, &s.pinned.fd));
  s.pinned.base = static_cast<char*>(map_file(s.pinned.fd, pinned_capacity));
  if (s.events == nullptr || s.pinned.base == nullptr) {
    return orErrorInitializationError;
  }
  s.pinned.capacity = pinned_capacity;
  s.pinned.free.emplace(0, pinned_capacity);
  for (int e = kMaxEvents - 1; e >= 0; --e) {
    s.free_events.push_back(e);
  }
  std::vector<std::future<int>> spawned;
  for (auto& dev : rt->devices) {
    auto* pd = new ProcessDevice();  // leaked with the runtime
    pd->dev = dev.get();
    dev->process = pd;
    std::string name = "openreg-control-" + std::to_string(dev->index);
    OR_RETURN_IF_ERROR(
        create_file(name.c_str(), sizeof(Control), &pd->control_fd));
    pd->control =
        static_cast<Control*>(map_file(pd->control_fd, sizeof(Control)));
    if (pd->control == nullptr) {
      return orErrorInitializationError;
    }
    Control& c = *pd->control;
    c.magic = kMagic;
    c.device = dev->index;
    c.device_count = count;
    c.parent_pid = getpid();
    for (int d = 0; d < count; ++d) {
      c.arena_base[d] = reinterpret_cast<uint64_t>(rt->devices[d]->device_base);
      pd->arena_fds.push_back(rt->devices[d]->fd);
    }
    c.arena_capacity = rt->capacity;
    c.pinned_base = reinterpret_cast<uint64_t>(s.pinned.base);
    c.pinned_capacity = pinned_capacity;
    pd->ring_used[0] = true;  // the default stream's
    dev->default_stream->proc_ring_ = 0;
  }
  for (auto& dev : rt->devices) {
    std::promise<int> promise;
    spawned.push_back(promise.get_future());
    dev->process->watcher =
        std::thread(watch, dev->process, std::move(promise));
    dev->process->watcher.detach();
  }
  orError_t result = orSuccess;
  for (size_t d = 0; d < spawned.size(); ++d) {
    if (spawned[d].get() < 0) {
      result = orErrorInitializationError;
      continue;
    }
    // Wait until the device process has mapped everything (or died).
    ProcessDevice& pd = *rt->devices[d]->process;
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (pd.control->ready.load(std::memory_order_acquire) == 0) {
      if (pd.dev->lost.load() || Clock::now() > until) {
        std::fprintf(stderr, "openreg: device process %d did not start%s\n",
                     pd.dev->index,
                     pd.dev->lost.load() ? " (it ended)" : " in 30 s");
        result = orErrorInitializationError;
        break;
      }
      futex_wait(&pd.control->ready, 0, 50);
    }
  }
  return result;
}

int device_pid(const Device* dev) { return of(dev).pid; }

// ---- streams ----------------------------------------------------------

orError_t stream_create(orStream* stream) {
  ProcessDevice& pd = of(stream->device());
  int ring = -1;
  {
    std::lock_guard<std::mutex> lock(pd.rings_mu);
    for (int r = 1; r < kMaxStreams; ++r) {
      if (!pd.ring_used[r]) {
        pd.ring_used[r] = true;
        ring = r;
        break;
      }
    }
  }
  if (ring < 0) {
    return orErrorMemoryAllocation;  // as a device out of stream slots
  }
  // A ring's counters only grow, across the streams that use it in turn:
  // an event's record is identified by (ring, ticket) forever.
  Ring& rg = pd.control->rings[ring];
  rg.error_state.store(0);
  stream->proc_tail_ = rg.tail.load();
  orError_t err = request(pd, kStartStream, ring, 0, nullptr);
  if (err != orSuccess) {
    std::lock_guard<std::mutex> lock(pd.rings_mu);
    pd.ring_used[ring] = false;
    return err;
  }
  stream->proc_ring_ = ring;
  return orSuccess;
}

void stream_destroy(orStream* stream) {
  ProcessDevice& pd = of(stream->device());
  if (stream->proc_ring_ <= 0) {
    return;
  }
  if (request(pd, kStopStream, stream->proc_ring_, 0, nullptr) == orSuccess) {
    std::lock_guard<std::mutex> lock(pd.rings_mu);
    pd.ring_used[stream->proc_ring_] = false;
  }  // else the device is lost: its ring is never reused
  stream->proc_ring_ = -1;
}

namespace {

// Waits until the ring has completed `target` commands; orErrorDeviceLost if
// the device process ends first.
orError_t wait_ring(const Device* dev, Ring& ring, uint64_t target) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(20);
  while (ring.completed.load(std::memory_order_acquire) < target &&
         Clock::now() < spin_until) {
  }
  while (ring.completed.load(std::memory_order_acquire) < target) {
    OR_RETURN_IF_ERROR(check_not_lost(dev));
    ring.host_waiting.fetch_add(1, std::memory_order_seq_cst);
    const uint64_t seen = ring.completed.load(std::memory_order_seq_cst);
    if (seen < target) {
      futex_wait(&ring.completed, static_cast<uint32_t>(seen), 50);
    }
    ring.host_waiting.fetch_sub(1, std::memory_order_seq_cst);
  }
  return orSuccess;
}

// Appends a command; *ticket is its number (it has completed once the
// ring's count exceeds it).
orError_t push(orStream* stream, const SlotHeader& header, const void* params,
               size_t bytes, uint64_t* ticket = nullptr) {
  Device* dev = stream->device();
  Ring& ring = of(dev).control->rings[stream->proc_ring_];
  std::lock_guard<std::mutex> lock(stream->proc_mu_);
  OR_RETURN_IF_ERROR(check_not_lost(dev));
  const uint64_t t = stream->proc_tail_;
  if (t >= kRingSlots) {
    // The slot is free once the command one lap back has completed.
    OR_RETURN_IF_ERROR(wait_ring(dev, ring, t - kRingSlots + 1));
  }
  Slot& slot = ring.slots[t % kRingSlots];
  slot.h = header;
  if (bytes != 0) {
    std::memcpy(slot.params, params, bytes);
  }
  stream->proc_tail_ = t + 1;
  ring.tail.store(t + 1, std::memory_order_seq_cst);
  if (ring.worker_sleeping.load(std::memory_order_seq_cst) != 0) {
    futex_wake(&ring.tail);
  }
  if (ticket != nullptr) {
    *ticket = t;
  }
  return orSuccess;
}

}  // namespace

orError_t stream_synchronize(orStream* stream) {
  Device* dev = stream->device();
  Ring& ring = of(dev).control->rings[stream->proc_ring_];
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(stream->proc_mu_);
    target = stream->proc_tail_;
  }
  OR_RETURN_IF_ERROR(wait_ring(dev, ring, target));
  if (ring.error_state.load(std::memory_order_acquire) == 2) {
    const auto code = static_cast<orError_t>(ring.error_code);
    std::string message = ring.error_message;
    if (message.empty() && ring.error_function >= 0) {
      std::lock_guard<std::mutex> lock(shared().names_mu);
      const auto id = static_cast<size_t>(ring.error_function);
      if (id < shared().function_names.size()) {
        message = "kernel '" + shared().function_names[id] +
                  "' failed (returned " + std::to_string(ring.error_status) +
                  ")";
      }
    }
    stream->record_error(code, message.c_str());
    ring.error_state.store(0, std::memory_order_release);
  }
  return orSuccess;
}

bool stream_idle(orStream* stream) {
  Ring& ring = of(stream->device()).control->rings[stream->proc_ring_];
  std::lock_guard<std::mutex> lock(stream->proc_mu_);
  return ring.completed.load(std::memory_order_acquire) == stream->proc_tail_;
}

// ---- named kernels ----------------------------------------------------

orError_t module_load(orModule_st* module, const char* path) {
  const int id = shared().next_module.fetch_add(1);
  if (id >= kMaxModules) {
    return orErrorMemoryAllocation;
  }
  // On every device that works: a lost device runs nothing anyway.
  for (auto& dev : runtime().devices) {
    const orError_t err = request(of(dev.get()), kLoadModule, id, 0, path);
    if (err != orSuccess && err != orErrorDeviceLost) {
      return err;
    }
  }
  module->id = id;
  return orSuccess;
}

void module_unload(orModule_st* module) {
  for (auto& dev : runtime().devices) {
    request(of(dev.get()), kUnloadModule, module->id, 0, nullptr);
  }
}

orError_t function_get(orModule_st* module, const char* name,
                       orFunction_st* fn) {
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(shared().names_mu);
    id = static_cast<int>(shared().function_names.size());
    if (id >= kMaxFunctions) {
      return orErrorMemoryAllocation;
    }
    shared().function_names.push_back(name);
  }
  for (auto& dev : runtime().devices) {
    const orError_t err =
        request(of(dev.get()), kGetFunction, module->id, id, name);
    if (err != orSuccess && err != orErrorDeviceLost) {
      return err;
    }
  }
  fn->id = id;
  return orSuccess;
}

orError_t launch(orStream* stream, const orFunction_st* fn, const void* params,
                 size_t bytes) {
  SlotHeader h{};
  h.command = kLaunch;
  h.function = static_cast<uint32_t>(fn->id);
  h.bytes = bytes;
  return push(stream, h, params, bytes);
}

// ---- memory -----------------------------------------------------------

orError_t pinned_alloc(size_t size, void** ptr) {
  PinnedPool& pool = shared().pinned;
  const size_t need = (size + 4095) / 4096 * 4096;
  std::lock_guard<std::mutex> lock(pool.mu);
  for (auto it = pool.free.begin(); it != pool.free.end(); ++it) {
    if (it->second >= need) {
      const size_t offset = it->first;
      const size_t rest = it->second - need;
      pool.free.erase(it);
      if (rest != 0) {
        pool.free.emplace(offset + need, rest);
      }
      pool.live.emplace(offset, need);
      *ptr = pool.base + offset;
      return orSuccess;
    }
  }
  return orErrorMemoryAllocation;
}

void pinned_free(void* ptr) {
  PinnedPool& pool = shared().pinned;
  std::lock_guard<std::mutex> lock(pool.mu);
  auto it =
      pool.live.find(static_cast<size_t>(static_cast<char*>(ptr) - pool.base));
  if (it == pool.live.end()) {
    return;
  }
  size_t offset = it->first;
  size_t size = it->second;
  pool.live.erase(it);
  fallocate(pool.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            static_cast<off_t>(offset), static_cast<off_t>(size));
  auto next = pool.free.lower_bound(offset);
  if (next != pool.free.end() && offset + size == next->first) {
    size += next->second;
    next = pool.free.erase(next);
  }
  if (next != pool.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      pool.free.erase(prev);
    }
  }
  pool.free.emplace(offset, size);
}

bool is_pinned(const void* p, size_t n) {
  const PinnedPool& pool = shared().pinned;
  const auto* c = static_cast<const char*>(p);
  return c >= pool.base && c < pool.base + pool.capacity &&
         n <= static_cast<size_t>(pool.base + pool.capacity - c);
}

namespace {

orError_t copy_command(orStream* stream, const void* dst, const void* src,
                       size_t count, bool wait) {
  SlotHeader h{};
  h.command = kCopy;
  h.a = reinterpret_cast<uint64_t>(dst);
  h.b = reinterpret_cast<uint64_t>(src);
  h.c = count;
  uint64_t ticket = 0;
  OR_RETURN_IF_ERROR(push(stream, h, nullptr, 0, &ticket));
  if (!wait) {
    return orSuccess;
  }
  Device* dev = stream->device();
  return wait_ring(dev, of(dev).control->rings[stream->proc_ring_], ticket + 1);
}

}  // namespace

// dst/src were validated by the caller: device sides are live ranges, host
// sides pinned or pageable. `stream` runs it; `wait` makes it synchronous.
orError_t copy(orStream* stream, void* dst, const void* src, size_t count,
               bool dst_is_device, bool src_is_device, bool wait) {
  if (count == 0) {
    return wait ? stream_synchronize(stream) : orSuccess;
  }
  if (!dst_is_device && !src_is_device && wait) {
    OR_RETURN_IF_ERROR(stream_synchronize(stream));
    std::memmove(dst, src, count);
    return orSuccess;
  }
  const bool dst_ok = dst_is_device || is_pinned(dst, count);
  const bool src_ok = src_is_device || is_pinned(src, count);
  if (dst_ok && src_ok) {
    return copy_command(stream, dst, src, count, wait);
  }
  // Pageable host memory: staged through the pinned pool in chunks, as a
  // real driver does (the device cannot reach pageable memory).
  void* staging = nullptr;
  OR_RETURN_IF_ERROR(pinned_alloc(std::min(count, kStagingBytes), &staging));
  orError_t err = orSuccess;
  for (size_t done = 0; done < count && err == orSuccess;) {
    const size_t n = std::min(count - done, kStagingBytes);
    if (!src_ok) {  // host -> device
      std::memcpy(staging, static_cast<const char*>(src) + done, n);
      err = copy_command(stream, static_cast<char*>(dst) + done, staging, n,
                         true);
    } else {  // device -> host
      err = copy_command(stream, staging, static_cast<const char*>(src) + done,
                         n, true);
      if (err == orSuccess) {
        std::memcpy(static_cast<char*>(dst) + done, staging, n);
      }
    }
    done += n;
  }
  pinned_free(staging);
  return err;
}

orError_t memset(orStream* stream, void* dst, int value, size_t count) {
  SlotHeader h{};
  h.command = kMemset;
  h.a = reinterpret_cast<uint64_t>(dst);
  h.b = static_cast<uint64_t>(static_cast<unsigned char>(value));
  h.c = count;
  uint64_t ticket = 0;
  OR_RETURN_IF_ERROR(push(stream, h, nullptr, 0, &ticket));
  Device* dev = stream->device();
  return wait_ring(dev, of(dev).control->rings[stream->proc_ring_], ticket + 1);
}

// ---- events -----------------------------------------------------------

int event_slot_alloc() {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.events_mu);
  if (s.free_events.empty()) {
    return -1;
  }
  const int slot = s.free_events.back();
  s.free_events.pop_back();
  s.events->slots[slot].completed.store(0);
  s.events->slots[slot].timestamp_ns = 0;
  return slot;
}

void event_slot_free(int slot) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.events_mu);
  s.free_events.push_back(slot);
}

orError_t event_record(orStream* stream, int slot, uint64_t generation,
                       uint64_t* ticket) {
  SlotHeader h{};
  h.command = kEventRecord;
  h.a = static_cast<uint64_t>(slot);
  h.b = generation;
  return push(stream, h, nullptr, 0, ticket);
}

bool ticket_done(const Device* dev, int ring, uint64_t ticket) {
  return of(dev).control->rings[ring].completed.load(
             std::memory_order_acquire) > ticket;
}

orError_t wait_ticket(const Device* dev, int ring, uint64_t ticket) {
  return wait_ring(dev, of(dev).control->rings[ring], ticket + 1);
}

orError_t event_wait(orStream* stream, int slot, uint64_t generation) {
  SlotHeader h{};
  h.command = kEventWait;
  h.a = static_cast<uint64_t>(slot);
  h.b = generation;
  return push(stream, h, nullptr, 0);
}

uint64_t event_completed(int slot) {
  return shared().events->slots[slot].completed.load(std::memory_order_acquire);
}

uint64_t event_timestamp_ns(int slot) {
  return shared().events->slots[slot].timestamp_ns;
}

void event_force_complete(int slot, uint64_t generation) {
  EventSlot& e = shared().events->slots[slot];
  uint64_t seen = e.completed.load();
  while (seen < generation &&
         !e.completed.compare_exchange_weak(seen, generation)) {
  }
  futex_wake(&e.completed);
}

// ---- loss -------------------------------------------------------------

orError_t kill_device(Device* dev, const char* reason) {
  ProcessDevice& pd = of(dev);
  {
    std::lock_guard<std::mutex> lock(dev->lost_mutex);
    if (dev->lost.load()) {
      return orSuccess;
    }
    dev->lost_reason = reason != nullptr ? reason : "lost (simulated)";
  }
  pd.kill_requested.store(true);
  kill(pd.pid, SIGKILL);
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!dev->lost.load(std::memory_order_acquire) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return orSuccess;
}

}  // namespace proc
}  // namespace openreg_rt
