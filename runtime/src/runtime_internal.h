// Internal state of the simulated device. Nothing outside runtime/src may
// include this file: the public surface is include/openreg.h.
#pragma once

#include <openreg.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

struct orStream;

// A loaded kernel library (module.cpp).
struct orModule_st {
  void* handle = nullptr;  // dlopen's (thread driver)
  int id = -1;             // the device processes' number (process driver)
  std::string path;
  std::mutex mu;  // guards functions
  std::map<std::string, std::unique_ptr<orFunction_st>> functions;
};

// One kernel of a module; lives as long as its module.
struct orFunction_st {
  orModule_st* module = nullptr;
  orDeviceKernelFn fn = nullptr;  // thread driver
  int id = -1;                    // process driver
  std::string name;
};

namespace openreg_rt {

namespace proc {
struct ProcessDevice;
}

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
//
// The file is longer than the arena: past `capacity` lies the export table
// of IPC (ipc.cpp), one uint64 generation per kAllocAlignment bytes of arena,
// nonzero while the allocation starting there is exported.
struct Device {
  int index = 0;
  size_t capacity = 0;
  int fd = -1;
  uint64_t inode = 0;  // of the memfd: identifies it in IPC handles
  char* device_base = nullptr;
  char* kernel_base = nullptr;
  // Process driver: the arena mapped read-write in the user's process for
  // the communication library (orMemGetDmaPointer), at its first call; set
  // once under mem_mutex, never unmapped.
  std::atomic<char*> dma_base{nullptr};

  std::mutex mem_mutex;                  // guards the four fields below
  std::map<size_t, size_t> live;         // offset -> size of live blocks
  std::map<size_t, size_t> free_ranges;  // offset -> size, coalesced
  size_t used = 0;                       // bytes in live blocks
  // The export table mapped read-write, after the first orIpcGetMemHandle.
  std::atomic<uint64_t>* export_table = nullptr;

  // Lost (orSimulateDeviceLoss): set once, never cleared.
  std::atomic<bool> lost{false};
  std::mutex lost_mutex;    // guards lost_reason
  std::string lost_reason;  // set before `lost`

  // Warnings of named kernels (orKernelContext::warn), thread driver: kept
  // until orDeviceTakeWarnings, at most OR_MAX_PENDING_WARNINGS per stream.
  std::mutex warnings_mutex;  // guards the three fields below
  std::vector<std::string> warnings;
  std::map<const Stream*, size_t> warnings_kept;  // per stream
  uint64_t warnings_dropped = 0;
  std::atomic<bool> warnings_pending{false};  // set under warnings_mutex

  std::mutex streams_mutex;  // guards the three fields below
  // Every live stream of the device, and the destroyed ones whose work has
  // not finished (orStreamDestroy).
  std::set<Stream*> streams;
  // The first failure of a destroyed stream's work, found when the stream
  // was freed; the next orDeviceSynchronize reports it.
  orError_t destroyed_error = orSuccess;
  Stream* default_stream = nullptr;  // created with the device, never freed

  // The process driver's side of the device (process_driver.cpp), or
  // nullptr with the thread driver.
  proc::ProcessDevice* process = nullptr;

  bool contains(const void* p) const {
    auto c = static_cast<const char*>(p);
    return c >= device_base && c < device_base + capacity;
  }
};

struct Runtime {
  std::vector<std::unique_ptr<Device>> devices;
  size_t capacity = 0;
};

// How both drivers name a named kernel in messages: 'name', followed by
// " (activity)" when the kernel described what it was doing
// (orKernelContext::describe; activity may be NULL or empty). module.cpp.
std::string kernel_label(const std::string& name, const char* activity);
// The message that counts the warnings a device dropped.
std::string dropped_warnings_message(uint64_t dropped);
// A kernel that failed without a report_error message.
std::string failed_kernel_message(const std::string& name, const char* activity,
                                  int status);

// SIMULATOR ONLY: counts this process's host threads blocked in a wait for
// a device, for the scope of the object: a stream's synchronization or a
// launch waiting for room (orStream::wait_completed; the process driver's
// proc::wait_ring), an event's (orEventSynchronize).
// orKernelContext::team_threads reads it (the device processes, in their
// control blocks).
class HostWaiting {
 public:
  HostWaiting();
  ~HostWaiting();
  HostWaiting(const HostWaiting&) = delete;
  HostWaiting& operator=(const HostWaiting&) = delete;
};
// ---- Host waits that last (openreg.h, orSetHostWaitCheck) -------------
// A blocked host thread looks again at the wait check, the watchdog and a
// lost device after each slice of this length without the awaited progress.
constexpr std::chrono::milliseconds kWaitSlice{20};
// OPENREG_KERNEL_TIMEOUT in nanoseconds; 0: the watchdog is off. device.cpp.
int64_t kernel_timeout_ns();
// Every command `dev`'s streams have completed so far (both drivers), and,
// when `running` is given, what runs now on one of them that is busy ("" if
// nothing is known). wait.cpp.
uint64_t device_progress(Device* dev, std::string* running);
// Marks, for its scope, that this thread holds a device's streams_mutex
// (orDeviceSynchronize), so device_progress does not take it again.
class StreamsLocked {
 public:
  StreamsLocked();
  ~StreamsLocked();
  StreamsLocked(const StreamsLocked&) = delete;
  StreamsLocked& operator=(const StreamsLocked&) = delete;
};
// Makes `dev` lost for `reason` (the first reason stays): the thread driver
// drops the device's queued work; the process driver ends the device
// process. device.cpp.
orError_t lose_device(Device* dev, const char* reason);
// Frees the destroyed streams of `dev` whose work has finished, keeping the
// first failure of that work in dev->destroyed_error. stream.cpp.
void reap_destroyed_streams(Device* dev);

// One host wait that may last. The waiting thread calls tick() after each
// kWaitSlice it slept without the awaited progress; tick() says whether to
// go on (orSuccess), or that the wait ends: orErrorInterrupted (the check
// asked for it, interruptible waits only) or orErrorDeviceLost (the device
// was lost meanwhile, or by the watchdog now). wait.cpp.
class LongWait {
 public:
  LongWait(Device* dev, bool interruptible)
      : dev_(dev), interruptible_(interruptible) {}
  orError_t tick();

 private:
  Device* dev_;
  bool interruptible_;
  bool started_ = false;
  uint64_t progress_ = 0;  // device_progress() when it last moved
  std::chrono::steady_clock::time_point since_;
};

// orKernelContext::team_threads of the thread driver. module.cpp.
int team_threads_now(int threads);

// True while a host thread of this process waits for a device (HostWaiting).
// module.cpp.
bool host_waiting_now();

// True when OPENREG_DRIVER=process: every device is a process of its own
// (process_driver.cpp) and the functions below route to proc::.
bool process_driver();
// False when OPENREG_NIC_DMA=0: orMemGetDmaPointer is not supported.
bool nic_dma();

namespace proc {
// The process driver (process_driver.cpp). Callers have validated their
// arguments as for the thread driver.
orError_t start(Runtime* rt, size_t pinned_capacity);
int device_pid(const Device* dev);
orError_t stream_create(Stream* stream);
void stream_destroy(Stream* stream);
// Moves the ring's error in; `interruptible` as for orStream::synchronize.
orError_t stream_synchronize(Stream* stream, bool interruptible);
// Every command the device's rings have completed, and the kernel running
// now on one of them ("" if none) when `running` is given.
uint64_t progress(Device* dev, std::string* running);
bool stream_idle(Stream* stream);
// Stores `count`, the host threads now waiting for a device (HostWaiting),
// in every device process's control block.
void publish_host_waiting(int count);
// Loads `path` in every device process; on failure, *why is the failing
// device's loader message.
orError_t module_load(orModule_st* module, const char* path, std::string* why);
void module_unload(orModule_st* module);
orError_t function_get(orModule_st* module, const char* name,
                       orFunction_st* fn);
orError_t launch(Stream* stream, const orFunction_st* fn, const void* params,
                 size_t bytes);
orError_t pinned_alloc(size_t size, void** ptr);
void pinned_free(void* ptr);
orError_t copy(Stream* stream, void* dst, const void* src, size_t count,
               bool dst_is_device, bool src_is_device, bool wait);
orError_t memset(Stream* stream, void* dst, int value, size_t count);
// Queues a host-to-device copy of at most OR_MAX_INLINE_COPY_BYTES whose
// bytes travel in the command itself.
orError_t copy_inline(Stream* stream, void* dst, const void* src, size_t count);
// orDeviceTakeWarnings for a device process.
void take_warnings(Device* dev, orWarningFn fn, void* user_data);
// Maps memory another user process exported in every device process
// (ipc.cpp): [offset, offset + length) of the file at `path` (openable by a
// device process) at this process's address `base`; import `slot` names it.
orError_t map_import(int slot, const char* path, uint64_t offset,
                     uint64_t length, uint64_t base);
void unmap_import(int slot);
// A free slot of the event table, or -1; *base is the generation its
// previous events reached (generations of a slot only grow, so a wait
// queued for an earlier event of the slot is never undone by a later one).
int event_slot_alloc(uint64_t* base);
// Gives the slot back once its latest record (ticket in `ring` of `dev`,
// ring -1: never recorded) has completed or the device is lost; returns at
// once, as cudaEventDestroy does.
void event_slot_free(int slot, const Device* dev, int ring, uint64_t ticket,
                     uint64_t generation);
// Records into the event's slot (for device-side waits); *ticket is the
// command's number in the stream's ring. The host asks the ring whether a
// record has completed (ticket_done, wait_ticket), so "the event has
// completed" and "its stream has finished" always agree.
orError_t event_record(Stream* stream, int slot, uint64_t generation,
                       uint64_t* ticket);
bool ticket_done(const Device* dev, int ring, uint64_t ticket);
orError_t wait_ticket(Device* dev, int ring, uint64_t ticket,
                      bool interruptible);
orError_t event_wait(Stream* stream, int slot, uint64_t generation);
uint64_t event_completed(int slot);
// orStreamWaitValue32 for a device process (the word is pinned memory).
orError_t wait_value(Stream* stream, const void* addr, uint32_t value);
uint64_t event_timestamp_ns(int slot);
void event_force_complete(int slot, uint64_t generation);
orError_t kill_device(Device* dev, const char* reason);
}  // namespace proc

// Completes the events whose latest record was on `dev` (a lost device
// never records them): event.cpp.
void complete_events_of(Device* dev);

// Set in a forked child of a process that initialised the runtime.
extern std::atomic<bool> g_forked;

// Initialises the runtime once; returns orSuccess or why it failed. Checks the
// fork flag first, so every API entry point calls this before anything else.
orError_t ensure_init();
// Valid only after ensure_init() returned orSuccess.
Runtime& runtime();
// Device by ordinal, or nullptr when out of range (after ensure_init).
Device* device_at(int index);
// The device whose arena contains p, or nullptr (memory imported from
// another process is not in an arena: see find_device_range).
Device* device_of(const void* p);
int current_device();

// A range of device addresses and where kernels reach the same bytes: a
// device's arena, or an allocation imported from another process.
struct DeviceRange {
  Device* dev = nullptr;  // nullptr: p is not device memory
  char* device_base = nullptr;
  char* kernel_base = nullptr;
  size_t size = 0;
  bool imported = false;
  int owner_pid = 0;  // imported only: the exporting process
  // Imported with the process driver: the communication library's view in
  // this process (orMemGetDmaPointer), nullptr without one.
  char* dma_base = nullptr;
};
// The range that contains p: the arenas first (the hot path), then the
// imported allocations. False for host memory.
bool find_device_range(const void* p, DeviceRange* out);
// A spinning wait's pause between two looks at a shared word.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// orErrorDeviceLost if `dev` (may be null) is lost.
inline orError_t check_not_lost(const Device* dev) {
  return dev != nullptr && dev->lost.load(std::memory_order_acquire)
             ? orErrorDeviceLost
             : orSuccess;
}
// The imported allocation that contains p (ipc.cpp). Lock-free and
// async-signal-safe, so the fault handler uses it too.
bool find_imported(const void* p, DeviceRange* out);
// Size of the export table that follows an arena of `capacity` bytes.
size_t export_table_bytes(size_t capacity);
// Called by orFree with dev.mem_mutex held: the block at `offset` is gone,
// so handles exported for it become stale.
void forget_export(Device& dev, size_t offset);

// Memory helpers shared by memcpy and streams.
// Checks that [p, p + n) lies inside one live allocation of dev.
bool range_is_live(Device& dev, const void* p, size_t n);
// The same for any range: a live allocation of an arena, or inside an
// imported allocation.
bool range_is_valid(const DeviceRange& range, const void* p, size_t n);
void* kernel_ptr(Device& dev, const void* p);
void* kernel_ptr(const DeviceRange& range, const void* p);
bool host_range_is_pinned(const void* p, size_t n);
// Fills attributes for a host pointer (pinned or not).
orError_t host_attributes(orPointerAttributes* attributes, const void* p);

// Installs the SIGSEGV/SIGBUS diagnostic (idempotent).
void install_fault_handler(const Runtime* rt);

}  // namespace openreg_rt

// An in-order work queue drained by one worker thread (started lazily).
//
// Thread-safety: every public member may be called from any thread. The
// queue is a bounded ring of task slots (the slots are the task pool: a
// launch allocates nothing); launching takes no lock: a producer claims a
// ticket with one atomic increment, fills the slot and publishes it. The
// worker is the only consumer. Completion is an atomic counter; a thread
// that waits registers the count it waits for, and the worker wakes it only
// when that count is reached (not at every task).
struct orStream {
  using Device = openreg_rt::Device;

  // Tasks a stream holds before a launch waits for room (CUDA's launch
  // queue is bounded too: a host far ahead of the device blocks).
  static constexpr uint64_t kCapacity = 1024;
  // How many tasks must have drained before a launch that found the ring
  // full goes on (see push()).
  static constexpr uint64_t kRefill = kCapacity / 4;
  // A slot keeps a named kernel's parameter buffer for its next launch up
  // to this size (at most kCapacity * kKeptParams bytes per stream).
  static constexpr size_t kKeptParams = 4096;

  orStream(Device* dev, int priority, bool is_default);
  ~orStream();
  orStream(const orStream&) = delete;
  orStream& operator=(const orStream&) = delete;

  Device* device() const { return dev_; }
  int priority() const { return priority_; }
  // orStreamDestroy was called while its work was queued: the stream stays
  // in its device's set until that work has finished. Guarded by the
  // device's streams_mutex.
  bool destroyed = false;
  bool is_default() const { return is_default_; }

  // Appends work; returns at once (or when the ring has room again).
  orError_t enqueue(std::function<void()> task);
  // Appends a launched kernel (orLaunchKernelEx): no allocation.
  // `host_threads` is orLaunchAttributes::hostThreads.
  // Each returns orErrorDeviceLost when the ring stays full because the
  // device was lost (nothing enqueued).
  orError_t enqueue_kernel(orKernelFn fn, void* user_data, int host_threads,
                           const char* name = nullptr);
  // Appends a named kernel (orLaunchFunction) with a copy of its parameter
  // bytes, made in the slot's own buffer (see Task::params).
  orError_t enqueue_function(orFunction_t fn, const void* params, size_t bytes,
                             int host_threads);
  // Appends a marker (an event record): when the worker reaches it, `signal`
  // runs under the stream's lock in the same step that counts it completed,
  // so "the event completed" and "the stream is idle" are never observed to
  // disagree. `signal` must be short and must not call into this stream.
  orError_t enqueue_marker(std::function<void()> signal);
  // True once all work enqueued so far has finished.
  bool idle();
  // Blocks until all work enqueued before the call has finished, then returns
  // and clears the first error a task recorded. `interruptible`: the host
  // wait check may end it early (orErrorInterrupted, nothing cleared).
  orError_t synchronize(bool interruptible = false);
  // The completions counted so far (device_progress).
  uint64_t completed() const {
    return completed_.load(std::memory_order_acquire);
  }
  // What the worker runs now, "" if idle or not known (the watchdog's
  // reason; kept only while the watchdog is on).
  std::string running();
  // Sets what running() says (the worker, a kernel that describes itself).
  void note_running(std::string label);
  // Called from tasks: remembers the first failure (and its message).
  void record_error(orError_t err, const char* message = nullptr);
  // The message of the failure the last synchronize() returned.
  std::string last_error_message();

  // private to stream.cpp:
  struct Task {
    std::function<void()> fn;     // runtime work (copies, markers), or
    orKernelFn kernel = nullptr;  // a launched kernel and its argument
    void* user_data = nullptr;
    orFunction_t function = nullptr;  // or a named kernel and its bytes
    // A named kernel's parameter bytes. The buffer belongs to the slot and
    // outlives the task: the next launch through the slot copies into it
    // (a buffer allocated by the launching thread and freed by the worker
    // made the two threads contend for the allocator's arena lock at every
    // launch). Buffers above kKeptParams are freed after their task.
    std::unique_ptr<char[]> params;
    size_t params_capacity = 0;
    size_t bytes = 0;
    bool marker = false;  // see enqueue_marker
    // The kernel may keep host threads besides the worker busy (its
    // hostThreads attribute is 0 or more than 1): see run().
    bool host_threads = false;
    const char* name = nullptr;  // orLaunchAttributes::name
  };
  // One ring entry. `seq` says whose turn it is: ticket t may fill the slot
  // when seq == t, the worker may take it when seq == t + 1.
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};
    Task task;
  };
  enum WorkerState : int { kNoWorker, kRunning, kSleeping };

  orError_t push(Task task);
  // Claims the next ticket's slot, waiting while the ring is full; publish()
  // hands the filled slot to the worker.
  Slot* claim(uint64_t* ticket);  // nullptr: the device was lost
  void publish(Slot& slot, uint64_t ticket);
  // The worker, after running the slot's task: clears it (keeping its
  // parameter buffer) and frees the slot for ticket head_ + kCapacity.
  void release(Slot& slot);
  void run();
  // Blocks until `completed_ >= target` (spins briefly first), or until the
  // wait ends early (LongWait: interrupted, device lost).
  orError_t wait_completed(uint64_t target, bool interruptible);
  // Called by the worker after counting completions: wakes the waiters whose
  // target is reached.
  void notify_waiters(uint64_t completed);
  // Wakes or starts the worker after a slot was published.
  void wake_worker();

  Device* dev_;
  int priority_;
  bool is_default_;
  std::unique_ptr<Slot[]> ring_;

  // Producers' side.
  alignas(64) std::atomic<uint64_t> tail_{0};  // tickets handed out
  // Worker's side.
  alignas(64) std::atomic<uint64_t> completed_{0};  // tasks finished
  uint64_t head_ = 0;  // next ticket the worker takes (worker only)

  // Waiting for completions: the smallest target of a waiting thread
  // (UINT64_MAX when none), read by the worker after each task.
  alignas(64) std::atomic<uint64_t> wake_at_{UINT64_MAX};
  std::mutex wait_mu_;  // guards waiters_, pairs with wait_cv_
  std::condition_variable wait_cv_;
  std::multiset<uint64_t> waiters_;

  // The worker's life: started by the first launch, asleep when idle,
  // retired after a while without work if it may hold host threads
  // (stream.cpp, run()).
  std::atomic<int> worker_state_{kNoWorker};
  std::mutex worker_mu_;  // guards worker_, stop_; pairs with work_cv_
  std::condition_variable work_cv_;
  std::thread worker_;
  bool stop_ = false;

  // Runs a named kernel on the worker.
  void run_function(Task& task);

  // Process driver: the stream's command ring in its device's control block
  // (-1: none), the commands pushed so far, the ring's completed count as
  // this host last read it (a lower bound: the count only grows) and
  // whether the device process runs the ring's worker yet (all under
  // proc_mu_).
  int proc_ring_ = -1;
  std::mutex proc_mu_;
  uint64_t proc_tail_ = 0;
  uint64_t proc_completed_seen_ = 0;
  bool proc_started_ = false;

  // The watchdog's view of the running task (only while it is on).
  std::mutex running_mu_;  // guards running_
  std::string running_;

  std::mutex mu_;  // markers and idle(); guards the three fields below
  orError_t error_ = orSuccess;
  std::string error_message_;     // of error_
  std::string reported_message_;  // of the error synchronize() returned
};

#define OR_RETURN_IF_ERROR(expr) \
  do {                           \
    orError_t or_err_ = (expr);  \
    if (or_err_ != orSuccess) {  \
      return or_err_;            \
    }                            \
  } while (0)
