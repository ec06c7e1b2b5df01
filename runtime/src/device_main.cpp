// openreg-device: one simulated device as its own process (the process
// driver, process_driver.cpp, starts one per device with posix_spawn).
//
// It maps the files the user's process passed down (process_protocol.h):
// its control block, the shared event slots, the pinned pool and every
// device's arena, read-write (the user's process keeps the no-access view
// of the arenas, and a read-write one for its communication library only,
// orMemGetDmaPointer). Its main thread answers requests (load a module, look
// up a function, start or stop a stream); each stream has a worker thread
// that takes commands from its ring in order and runs them. It ends with
// its parent (PR_SET_PDEATHSIG), and whatever kills it (a faulting kernel,
// kill -9) loses the device without harming the user's process.
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bulk_copy.h"
#include "device_team.h"
#include "process_protocol.h"

using namespace openreg_proc;

namespace {

Control* g_control = nullptr;
Events* g_events = nullptr;
char* g_pinned = nullptr;    // this process's mapping of the pinned pool
char* g_arena[kMaxDevices];  // this process's mappings of the arenas
void* g_modules[kMaxModules];
orDeviceKernelFn g_functions[kMaxFunctions];

// Memory other user processes exported, mapped read-write here (kMapImport).
// The main thread writes a slot, stream workers read it without a lock:
// `base` (the user process's address, 0: unused) is stored last and cleared
// first. Closing memory a queued kernel still uses is the user's error, as
// on the thread driver (there it faults the user's process; here it loses
// the device).
struct Import {
  std::atomic<uint64_t> base{0};
  std::atomic<uint64_t> size{0};
  std::atomic<char*> local{nullptr};
};
Import g_imports[kMaxImports];
std::atomic<int> g_import_end{0};  // slots at or past it were never used

using openreg_device::now_ns;

// The user process's address -> this process's, or nullptr.
void* translate_address(uint64_t addr) {
  for (int d = 0; d < g_control->device_count; ++d) {
    const uint64_t base = g_control->arena_base[d];
    if (addr >= base && addr < base + g_control->arena_capacity) {
      return g_arena[d] + (addr - base);
    }
  }
  const uint64_t pinned = g_control->pinned_base;
  if (addr >= pinned && addr < pinned + g_control->pinned_capacity) {
    return g_pinned + (addr - pinned);
  }
  const int end = g_import_end.load(std::memory_order_acquire);
  for (int i = 0; i < end; ++i) {
    const Import& im = g_imports[i];
    const uint64_t base = im.base.load(std::memory_order_acquire);
    if (base != 0 && addr >= base &&
        addr < base + im.size.load(std::memory_order_relaxed)) {
      return im.local.load(std::memory_order_relaxed) + (addr - base);
    }
  }
  return nullptr;
}

void* translate(orKernelContext*, const void* device_ptr) {
  return translate_address(reinterpret_cast<uint64_t>(device_ptr));
}

struct CallState {
  Ring* ring = nullptr;
  bool reported = false;
  char message[kMessageBytes];
};

void report_error(orKernelContext* ctx, const char* message) {
  auto* call = static_cast<CallState*>(ctx->driver_data);
  if (!call->reported) {
    call->reported = true;
    std::snprintf(call->message, sizeof(call->message), "%s",
                  message != nullptr ? message : "");
  }
}

void describe(orKernelContext* ctx, const char* what) {
  auto* call = static_cast<CallState*>(ctx->driver_data);
  std::snprintf(call->ring->activity, sizeof(call->ring->activity), "%s",
                what != nullptr ? what : "");
}

// Whether a thread of the user process waits for this device now
// (HostWaiting keeps the count in the control block).
bool host_waiting_now() {
  return g_control->host_waiting.load(std::memory_order_relaxed) > 0;
}

// [doc:device-team-threads]
// SIMULATOR ONLY: as the thread driver's (doc:team-threads in module.cpp):
// while no thread of the user process waits for a device, the host runs its
// own work on one of the cores, and a kernel that may run on fewer threads
// leaves it that one. The user process keeps the count of its waiting
// threads in this process's control block (HostWaiting).
int team_threads(orKernelContext*, int threads) {
  if (threads <= 1 || host_waiting_now()) {
    return threads;
  }
  return threads - 1;
}
// [/doc:device-team-threads]

void warn(orKernelContext* ctx, const char* message) {
  Ring& ring = *static_cast<CallState*>(ctx->driver_data)->ring;
  const uint64_t written = ring.warn_written.load(std::memory_order_relaxed);
  if (written - ring.warn_read.load(std::memory_order_acquire) >=
      OR_MAX_PENDING_WARNINGS) {
    ring.warn_dropped.fetch_add(1, std::memory_order_relaxed);
  } else {
    std::snprintf(ring.warnings[written % OR_MAX_PENDING_WARNINGS],
                  OR_MAX_WARNING_BYTES, "%s",
                  message != nullptr ? message : "");
    ring.warn_written.store(written + 1, std::memory_order_release);
  }
  g_control->warnings_pending.fetch_add(1, std::memory_order_seq_cst);
}

void record_error(Ring& ring, orError_t code, const char* message,
                  int function = -1, int status = 0) {
  uint32_t expected = 0;
  if (!ring.error_state.compare_exchange_strong(expected, 1)) {
    return;  // the first failure is kept
  }
  ring.error_code = code;
  ring.error_function = function;
  ring.error_status = status;
  std::memcpy(ring.error_activity, ring.activity, sizeof(ring.activity));
  std::snprintf(ring.error_message, sizeof(ring.error_message), "%s", message);
  ring.error_state.store(2, std::memory_order_release);
}

// An event's record completes its stream up to the record before it signals
// the event: a stream that waited for the event (kEventWait reads the slot)
// must find the recording stream done that far, as the thread driver's marker
// signals and counts under one lock. The time is taken first, for a host that
// synchronized on the count and reads it. `h` is a copy: once the count
// passes the ring slot, the host may refill it.
void record_event(Ring& ring, uint64_t completed, const SlotHeader h) {
  EventSlot& e = g_events->slots[h.a];
  e.timestamp_ns = now_ns();
  ring.completed.store(completed, std::memory_order_seq_cst);
  // Records of one event on several streams may finish out of order:
  // the slot keeps the latest generation.
  uint64_t seen = e.completed.load(std::memory_order_relaxed);
  while (seen < h.b && !e.completed.compare_exchange_weak(
                           seen, h.b, std::memory_order_seq_cst)) {
  }
  if (e.waiters.load(std::memory_order_seq_cst) != 0) {
    futex_wake(&e.completed);
  }
}

void run_command(Ring& ring, const Slot& slot) {
  const SlotHeader& h = slot.h;
  switch (h.command) {
    case kLaunch: {
      orDeviceKernelFn fn =
          h.function < kMaxFunctions ? g_functions[h.function] : nullptr;
      if (fn == nullptr) {
        record_error(ring, orErrorInvalidValue, "unknown function id");
        return;
      }
      CallState call;
      call.ring = &ring;
      orKernelContext ctx{};
      ctx.version = OR_KERNEL_CONTEXT_VERSION;
      ctx.device = g_control->device;
      ctx.translate = &translate;
      ctx.report_error = &report_error;
      ctx.driver_data = &call;
      ctx.describe = &describe;
      ctx.warn = &warn;
      ctx.team_threads = &team_threads;
      ring.activity[0] = '\0';
      ring.running.store(h.function + 1, std::memory_order_relaxed);
      const int status = fn(slot.params, h.bytes, &ctx);
      ring.running.store(0, std::memory_order_relaxed);
      if (status != 0) {
        record_error(ring, orErrorLaunchFailure,
                     call.reported ? call.message : "",
                     static_cast<int>(h.function), status);
      }
      return;
    }
    case kCopy: {
      void* dst = translate_address(h.a);
      void* src = translate_address(h.b);
      if (dst == nullptr || src == nullptr) {
        record_error(ring, orErrorInvalidValue, "copy outside device memory");
        return;
      }
      openreg_device::copy_bytes(static_cast<char*>(dst),
                                 static_cast<const char*>(src), h.c);
      return;
    }
    case kCopyInline: {
      void* dst = translate_address(h.a);
      if (dst == nullptr) {
        record_error(ring, orErrorInvalidValue, "copy outside device memory");
        return;
      }
      std::memcpy(dst, slot.params, h.bytes);
      return;
    }
    case kMemset: {
      void* dst = translate_address(h.a);
      if (dst == nullptr) {
        record_error(ring, orErrorInvalidValue, "memset outside device memory");
        return;
      }
      std::memset(dst, static_cast<int>(h.b), h.c);
      return;
    }
    case kEventWait: {
      EventSlot& e = g_events->slots[h.a];
      while (e.completed.load(std::memory_order_acquire) < h.b) {
        e.waiters.fetch_add(1, std::memory_order_seq_cst);
        const uint64_t seen = e.completed.load(std::memory_order_seq_cst);
        if (seen < h.b) {
          futex_wait(&e.completed, static_cast<uint32_t>(seen), 100);
        }
        e.waiters.fetch_sub(1, std::memory_order_seq_cst);
      }
      return;
    }
    case kWaitValue: {
      // Pinned memory (the host checked), woken by orHostWriteValue32.
      const auto* word = static_cast<const uint32_t*>(translate_address(h.a));
      if (word == nullptr) {
        record_error(ring, orErrorInvalidValue,
                     "wait on a value outside pinned memory");
        return;
      }
      const auto value = static_cast<uint32_t>(h.b);
      for (;;) {
        const uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (value_reached(seen, value)) {
          return;
        }
        futex_wait(word, seen, kValuePollMs);
      }
    }
    default:
      record_error(ring, orErrorInvalidValue, "unknown command");
  }
}

struct Worker {
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<uint32_t> exited{0};  // set by the worker as it returns
};
Worker g_workers[kMaxStreams];

// A stream's worker: commands in ring order. When it runs out of commands
// it spins briefly (the host often launches again at once), then announces
// it sleeps and futex-waits on the ring's tail. It spins once per idle
// stretch. It sleeps without a timeout: only a command or its stop wakes it
// (kStopStream wakes it until it has returned, since a wake-up sent between
// its last look at `stop` and its wait would be lost). (It used to wake
// every 100 ms to look at `stop`; with a spin after every timeout that kept
// the 74 idle workers of a device runnable, yielding to each other, at 100 %
// of a core per device process.)
void run_worker(int index) {
  Ring& ring = g_control->rings[index];
  Worker& self = g_workers[index];
  uint64_t head = ring.completed.load(std::memory_order_acquire);
  // This idle stretch has had its spin. A new worker has run nothing yet,
  // so it sleeps at once (the host wakes it with the first command): when
  // the host started a worker for every stream it created, the pools'
  // streams together, their 146 first spins (2000 polls, yielding after 100)
  // kept two devices' idle workers runnable for seconds, preempting the busy
  // stream's kernels. The host now starts a worker at a stream's first
  // command (process_queue.cpp, push).
  bool spun = true;
  for (;;) {
    uint64_t tail = ring.tail.load(std::memory_order_acquire);
    if (head == tail && !spun) {
      spun = true;
      for (int i = 0; i < 2000 && head == tail; ++i) {
        if (i > 100) {
          std::this_thread::yield();
        }
        tail = ring.tail.load(std::memory_order_acquire);
      }
    }
    if (head == tail) {
      if (self.stop.load(std::memory_order_acquire)) {
        self.exited.store(1, std::memory_order_release);
        futex_wake(&self.exited);
        return;
      }
      ring.worker_sleeping.store(1, std::memory_order_seq_cst);
      tail = ring.tail.load(std::memory_order_seq_cst);
      if (head == tail) {
        futex_wait_untimed(&ring.tail, static_cast<uint32_t>(tail));
      }
      ring.worker_sleeping.store(0, std::memory_order_relaxed);
      continue;
    }
    spun = false;
    const Slot& slot = ring.slots[head % kRingSlots];
    // A wait (event, host value) is not work: counted, a stream blocked
    // behind a collective kept the team spinning (docs/event.md). Fed to the
    // window at the end of this iteration, after the count: a hint (which
    // may start a thread) between the command and the count let a host that
    // had seen an event recorded by the command find the stream still busy
    // (s.query() after another stream waited for s's event).
    const openreg_device::TimedKernel timed(
        &host_waiting_now,
        slot.h.command != kEventWait && slot.h.command != kWaitValue);
    if (slot.h.command == kEventRecord) {
      record_event(ring, head + 1, slot.h);
    } else {
      run_command(ring, slot);
    }
    ++head;
    ring.completed.store(head, std::memory_order_seq_cst);
    // Pairs with the waiter's lowering of host_wake_at before its last look
    // at `completed` (both sequentially consistent).
    if (head >= ring.host_wake_at.load(std::memory_order_seq_cst)) {
      ring.host_wake_at.store(UINT64_MAX, std::memory_order_seq_cst);
      futex_wake(&ring.completed);
    }
  }
}

void answer(orError_t status, const char* why) {
  g_control->status = status;
  std::snprintf(g_control->answer, sizeof(g_control->answer), "%s",
                why != nullptr ? why : "");
}

// kMapImport: opens the exporter's arena file by the path the user process
// gave (its own descriptor of that file, under /proc) and maps the range.
void map_import(int slot) {
  const uint64_t offset = g_control->value[0];
  const uint64_t length = g_control->value[1];
  const uint64_t base = g_control->value[2];
  if (slot < 0 || slot >= kMaxImports || length == 0 || base == 0) {
    answer(orErrorInvalidValue, "bad import");
    return;
  }
  const int fd = open(g_control->text, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    answer(orErrorMapBufferObjectFailed, std::strerror(errno));
    return;
  }
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, fd, static_cast<off_t>(offset));
  const int mmap_errno = errno;
  close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) {
    answer(orErrorMapBufferObjectFailed, std::strerror(mmap_errno));
    return;
  }
  Import& im = g_imports[slot];
  im.local.store(static_cast<char*>(p), std::memory_order_relaxed);
  im.size.store(length, std::memory_order_relaxed);
  im.base.store(base, std::memory_order_release);
  if (slot >= g_import_end.load(std::memory_order_relaxed)) {
    g_import_end.store(slot + 1, std::memory_order_release);
  }
  answer(orSuccess, nullptr);
}

void serve(uint32_t request) {
  const int a0 = g_control->arg0;
  const int a1 = g_control->arg1;
  switch (request) {
    case kLoadModule: {
      void* handle = dlopen(g_control->text, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr || a0 < 0 || a0 >= kMaxModules) {
        answer(orErrorFileNotFound, dlerror());
        return;
      }
      g_modules[a0] = handle;
      openreg_device::take_team_spin_hint(handle);
      answer(orSuccess, nullptr);
      return;
    }
    case kGetFunction: {
      void* sym = a0 >= 0 && a0 < kMaxModules && g_modules[a0] != nullptr
                      ? dlsym(g_modules[a0], g_control->text)
                      : nullptr;
      if (sym == nullptr || a1 < 0 || a1 >= kMaxFunctions) {
        answer(orErrorSymbolNotFound, "no such kernel");
        return;
      }
      g_functions[a1] = reinterpret_cast<orDeviceKernelFn>(sym);
      answer(orSuccess, nullptr);
      return;
    }
    case kUnloadModule:
      if (a0 >= 0 && a0 < kMaxModules && g_modules[a0] != nullptr) {
        dlclose(g_modules[a0]);
        g_modules[a0] = nullptr;
      }
      answer(orSuccess, nullptr);
      return;
    case kStartStream:
      if (a0 < 0 || a0 >= kMaxStreams || g_workers[a0].thread.joinable()) {
        answer(orErrorInvalidValue, "bad stream");
        return;
      }
      g_workers[a0].stop.store(false);
      g_workers[a0].exited.store(0);
      g_workers[a0].thread = std::thread(run_worker, a0);
      answer(orSuccess, nullptr);
      return;
    case kStopStream:
      if (a0 < 0 || a0 >= kMaxStreams || !g_workers[a0].thread.joinable()) {
        answer(orErrorInvalidValue, "bad stream");
        return;
      }
      g_workers[a0].stop.store(true, std::memory_order_release);
      // The worker may have looked at `stop` just before and not be waiting
      // yet, which loses a wake-up: wake it until it has returned.
      while (g_workers[a0].exited.load(std::memory_order_acquire) == 0) {
        futex_wake(&g_control->rings[a0].tail);
        futex_wait(&g_workers[a0].exited, 0, 1);
      }
      g_workers[a0].thread.join();
      answer(orSuccess, nullptr);
      return;
    case kMapImport:
      map_import(a0);
      return;
    case kUnmapImport:
      if (a0 >= 0 && a0 < kMaxImports) {
        Import& im = g_imports[a0];
        char* local = im.local.load();
        const uint64_t size = im.size.load();
        im.base.store(0, std::memory_order_release);
        if (local != nullptr) {
          munmap(local, size);
        }
        im.local.store(nullptr);
      }
      answer(orSuccess, nullptr);
      return;
    default:
      answer(orErrorInvalidValue, "unknown request");
  }
}

void* map_fd(int fd, size_t bytes, const char* what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "openreg-device: mmap of the %s failed: %s\n", what,
                 std::strerror(errno));
    std::exit(3);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  // Usage: openreg-device PARENT_PID (the files are at the fixed fds).
  if (argc != 2) {
    std::fprintf(stderr,
                 "openreg-device is started by the openreg runtime "
                 "(OPENREG_DRIVER=process), not by hand\n");
    return 2;
  }
  // End with the user's process, however it ends; if it is already gone,
  // the signal was missed: end now.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != std::atoi(argv[1])) {
    return 1;
  }
  // A terminal's Ctrl-C is for the user's program, which turns it into
  // Python's KeyboardInterrupt and goes on using its devices: the device
  // runs in a process group of its own (the driver spawns it so), and
  // ignores SIGINT sent to it anyway.
  signal(SIGINT, SIG_IGN);
  g_control = static_cast<Control*>(
      map_fd(kControlFd, sizeof(Control), "control block"));
  if (g_control->magic != kMagic) {
    std::fprintf(stderr, "openreg-device: bad control block\n");
    return 3;
  }
  char name[16];
  std::snprintf(name, sizeof(name), "openreg-dev%d", g_control->device);
  prctl(PR_SET_NAME, name);
  g_events = static_cast<Events*>(map_fd(kEventsFd, sizeof(Events), "events"));
  g_pinned = static_cast<char*>(
      map_fd(kPinnedFd, g_control->pinned_capacity, "pinned pool"));
  for (int d = 0; d < g_control->device_count; ++d) {
    g_arena[d] = static_cast<char*>(
        map_fd(kFirstArenaFd + d, g_control->arena_capacity, "arena"));
  }
  // The default stream's worker (ring 0) runs from the start.
  g_workers[0].thread = std::thread(run_worker, 0);
  g_control->ready.store(1, std::memory_order_release);
  futex_wake(&g_control->ready);
  uint32_t served = g_control->response_seq.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t seq = g_control->request_seq.load(std::memory_order_acquire);
    if (seq == served) {
      futex_wait(&g_control->request_seq, seq, 1000);
      continue;
    }
    serve(g_control->request);
    served = seq;
    g_control->response_seq.store(seq, std::memory_order_release);
    futex_wake(&g_control->response_seq);
  }
}
