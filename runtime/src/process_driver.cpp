// The process driver (OPENREG_DRIVER=process): each device is a process of
// its own (openreg-device, device_main.cpp), fed through shared memory
// (process_protocol.h). This file is the user process's side of the device
// processes themselves: starting them, requests (modules, functions,
// streams' workers), and the watch that turns a device process's death into
// a lost device, and the kernels' warnings read from the control block.
// process_queue.cpp has the commands: streams, launches, copies, the pinned
// pool, events.
//
// What stays in the user's process: the device memory's bookkeeping
// (orMalloc/orFree, as a caching allocator would), the arenas' no-access
// views (addresses, the host-access diagnostic), pinned memory (a shared
// pool, so the device reads and writes it directly) and the event handles.
// The device process runs every copy, memset and kernel.
#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "process_internal.h"

extern char** environ;

namespace openreg_rt {
namespace proc {

using namespace openreg_proc;

Shared& shared() {
  static auto* s = new Shared();  // leaked: device processes outlive main()
  return *s;
}

namespace {

using Clock = std::chrono::steady_clock;

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
  // The kernel that was running, and what it said it did: the process has
  // ended, so its ring no longer changes.
  std::string running;
  for (int r = 0; r < kMaxStreams; ++r) {
    const Ring& ring = pd.control->rings[r];
    const uint32_t id = ring.running.load();
    if (id != 0) {
      char activity[kActivityBytes];
      std::memcpy(activity, ring.activity, sizeof(activity));
      activity[sizeof(activity) - 1] = '\0';
      std::lock_guard<std::mutex> lock(shared().names_mu);
      if (id - 1 < shared().function_names.size()) {
        running = kernel_label(shared().function_names[id - 1], activity);
      }
      break;
    }
  }
  std::string reason = "device " + std::to_string(dev->index) +
                       " was lost: its process (pid " + std::to_string(pd.pid) +
                       ") ended with " + describe_status(status);
  if (!running.empty()) {
    reason += " while running kernel " + running;
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
  // Its own process group: the terminal's signals (Ctrl-C, Ctrl-Z) go to
  // the user's program, not to its devices; they still end with it
  // (PR_SET_PDEATHSIG, the exit handler below).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int err =
      posix_spawn(&pid, exe.c_str(), &actions, &attr, argv, environ);
  posix_spawnattr_destroy(&attr);
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
  pd->reaped.store(true, std::memory_order_release);
}

// [doc:exit-reaping]
// At the normal exit of the user's process (exit(), a return from main,
// Python's interpreter exit), its device processes end with it and are
// reaped here: PR_SET_PDEATHSIG would kill them too, but as orphans whose
// status only init collects, and an init that does not reap (a container's)
// keeps them as zombies. A process that is killed, or ends with _exit,
// leaves them to PR_SET_PDEATHSIG and init. A child forked from the user's
// process inherits this handler, and must not end its parent's devices.
std::vector<ProcessDevice*> g_exit_devices;
pid_t g_owner = -1;

void end_device_processes() {
  if (getpid() != g_owner) {
    return;
  }
  for (ProcessDevice* pd : g_exit_devices) {
    if (pd->pid > 0 && !pd->reaped.load()) {
      pd->kill_requested.store(true);
      kill(pd->pid, SIGKILL);
    }
  }
  const auto until = Clock::now() + std::chrono::seconds(2);
  for (ProcessDevice* pd : g_exit_devices) {
    while (pd->pid > 0 && !pd->reaped.load() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}
// [/doc:exit-reaping]

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

}  // namespace

void PostedRequest::post(ProcessDevice& pd, Request what, int arg0, int arg1,
                         const char* text, const uint64_t* values) {
  pd_ = &pd;
  lock_ = std::unique_lock<std::mutex>(pd.request_mu);
  posted_ = check_not_lost(pd.dev);
  if (posted_ != orSuccess) {
    return;
  }
  Control& c = *pd.control;
  c.request = what;
  c.arg0 = arg0;
  c.arg1 = arg1;
  std::snprintf(c.text, sizeof(c.text), "%s", text != nullptr ? text : "");
  for (int i = 0; i < 3; ++i) {
    c.value[i] = values != nullptr ? values[i] : 0;
  }
  seq_ = c.request_seq.load() + 1;
  c.request_seq.store(seq_, std::memory_order_seq_cst);
  futex_wake(&c.request_seq);
}

orError_t PostedRequest::wait(std::string* why) {
  if (pd_ == nullptr || !lock_.owns_lock()) {
    return orErrorInvalidValue;  // never posted, or awaited twice
  }
  const orError_t posted = posted_;
  if (posted != orSuccess) {
    lock_.unlock();
    return posted;
  }
  Control& c = *pd_->control;
  for (;;) {
    const uint32_t done = c.response_seq.load(std::memory_order_acquire);
    if (done == seq_) {
      if (why != nullptr) {
        why->assign(c.answer, strnlen(c.answer, sizeof(c.answer)));
      }
      const auto status = static_cast<orError_t>(c.status);
      lock_.unlock();
      return status;
    }
    const orError_t lost = check_not_lost(pd_->dev);
    if (lost != orSuccess) {
      lock_.unlock();
      return lost;
    }
    futex_wait(&c.response_seq, done, 50);
  }
}

orError_t request(ProcessDevice& pd, Request what, int arg0, int arg1,
                  const char* text, const uint64_t* values, std::string* why) {
  PostedRequest r;
  r.post(pd, what, arg0, arg1, text, values);
  return r.wait(why);
}

void publish_host_waiting(int count) {
  for (auto& dev : runtime().devices) {
    if (dev->process != nullptr && dev->process->control != nullptr) {
      dev->process->control->host_waiting.store(count,
                                                std::memory_order_relaxed);
    }
  }
}

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
    dev->default_stream->proc_started_ = true;  // the device starts ring 0's
  }
  for (auto& dev : rt->devices) {
    std::promise<int> promise;
    spawned.push_back(promise.get_future());
    dev->process->watcher =
        std::thread(watch, dev->process, std::move(promise));
    dev->process->watcher.detach();
  }
  g_owner = getpid();
  for (auto& dev : rt->devices) {
    g_exit_devices.push_back(dev->process);
  }
  std::atexit(end_device_processes);
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

// ---- named kernels ----------------------------------------------------

orError_t module_load(orModule_st* module, const char* path, std::string* why) {
  const int id = shared().next_module.fetch_add(1);
  if (id >= kMaxModules) {
    return orErrorMemoryAllocation;
  }
  // On every device that works (a lost device runs nothing anyway), all at
  // once: each device process dlopens the library and what it links.
  auto& devices = runtime().devices;
  std::vector<PostedRequest> posted(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    posted[d].post(of(devices[d].get()), kLoadModule, id, 0, path);
  }
  orError_t first = orSuccess;
  for (size_t d = 0; d < devices.size(); ++d) {
    std::string answer;
    const orError_t err = posted[d].wait(&answer);
    if (err != orSuccess && err != orErrorDeviceLost && first == orSuccess) {
      first = err;
      *why = "device " + std::to_string(devices[d]->index) + ": " + answer;
    }
  }
  if (first != orSuccess) {
    return first;
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
  auto& devices = runtime().devices;
  std::vector<PostedRequest> posted(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    posted[d].post(of(devices[d].get()), kGetFunction, module->id, id, name);
  }
  orError_t first = orSuccess;
  for (auto& p : posted) {
    const orError_t err = p.wait();
    if (err != orSuccess && err != orErrorDeviceLost && first == orSuccess) {
      first = err;
    }
  }
  if (first != orSuccess) {
    return first;
  }
  fn->id = id;
  return orSuccess;
}

// ---- IPC ----------------------------------------------------------------

orError_t map_import(int slot, const char* path, uint64_t offset,
                     uint64_t length, uint64_t base) {
  if (slot < 0 || slot >= kMaxImports) {
    return orErrorInvalidValue;
  }
  const uint64_t values[3] = {offset, length, base};
  // Every device process maps it: a copy between devices may run on
  // either. A lost device runs nothing anyway.
  for (auto& dev : runtime().devices) {
    const orError_t err =
        request(of(dev.get()), kMapImport, slot, 0, path, values);
    if (err != orSuccess && err != orErrorDeviceLost) {
      unmap_import(slot);
      return err;
    }
  }
  return orSuccess;
}

void unmap_import(int slot) {
  for (auto& dev : runtime().devices) {
    request(of(dev.get()), kUnmapImport, slot, 0, nullptr);
  }
}

// ---- warnings ---------------------------------------------------------

void take_warnings(Device* dev, orWarningFn fn, void* user_data) {
  ProcessDevice& pd = of(dev);
  Control& c = *pd.control;
  if (c.warnings_pending.load(std::memory_order_acquire) == 0) {
    return;  // the common case: one load
  }
  std::lock_guard<std::mutex> lock(pd.warnings_mu);
  c.warnings_pending.exchange(0, std::memory_order_seq_cst);
  uint64_t dropped = 0;
  for (int r = 0; r < kMaxStreams; ++r) {
    Ring& ring = c.rings[r];
    const uint64_t written = ring.warn_written.load(std::memory_order_acquire);
    uint64_t read = ring.warn_read.load(std::memory_order_relaxed);
    for (; read < written; ++read) {
      char text[OR_MAX_WARNING_BYTES];
      std::memcpy(text, ring.warnings[read % OR_MAX_PENDING_WARNINGS],
                  sizeof(text));
      text[sizeof(text) - 1] = '\0';
      fn(user_data, text);
    }
    ring.warn_read.store(read, std::memory_order_release);
    dropped += ring.warn_dropped.exchange(0, std::memory_order_relaxed);
  }
  if (dropped > 0) {
    fn(user_data, dropped_warnings_message(dropped).c_str());
  }
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
