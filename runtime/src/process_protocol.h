// The shared-memory protocol between the process driver (process_driver.cpp,
// in the user's process) and a device process (device_main.cpp,
// openreg-device). Both sides include this file; nothing else does.
//
// Per device, one control file (a memfd) holds a Control block: the device's
// configuration, a request/response channel for rare operations (load a
// module, look up a function, start or stop a stream's worker) and
// kMaxStreams command rings. One events file, shared by every device
// process, holds the event slots. The arenas and the pinned pool are
// memfds mapped by every device process. All addresses in commands are the
// user process's: the device translates them with the bases in Control.
//
// A ring is single-producer (the host, under the stream's mutex) and
// single-consumer (the stream's worker in the device process). `tail` counts
// published commands, `completed` finished ones; each is waited on with a
// futex on its low 32 bits (little-endian), and woken only when the other
// side says it sleeps (worker_sleeping), or, for `completed`, when it
// reaches the count a host thread waits for (host_wake_at).
#pragma once

#include <linux/futex.h>
#include <openreg.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>

namespace openreg_proc {

constexpr uint32_t kMagic = 0x6f726770;      // "orgp"
constexpr int kMaxDevices = OR_MAX_DEVICES;  // the public header's limit
constexpr int kMaxStreams = 128;  // per device, the default stream included
constexpr uint32_t kRingSlots = 1024;  // as deep as the thread driver's queue
// Commands that must have completed before a launch that found its ring full
// goes on.
constexpr uint32_t kRingRefill = kRingSlots / 4;
constexpr int kMaxModules = 256;
constexpr int kMaxFunctions = 4096;
constexpr int kMaxEvents = 1 << 16;
constexpr size_t kMessageBytes = 1024;
// What orKernelContext::describe keeps (the NUL included).
constexpr size_t kActivityBytes = 128;
// Allocations of other user processes open at once (orIpcOpenMemHandle).
constexpr int kMaxImports = 1024;

// File descriptor numbers in the device process (posix_spawn dup2s them;
// every other descriptor but 0, 1 and 2 is closed).
constexpr int kControlFd = 3;
constexpr int kEventsFd = 4;
constexpr int kPinnedFd = 5;
constexpr int kFirstArenaFd = 6;  // + device ordinal

enum Command : uint32_t {
  kLaunch = 1,       // function, params[bytes]
  kCopy = 2,         // a = dst, b = src, c = bytes
  kMemset = 3,       // a = dst, b = value, c = bytes
  kEventRecord = 4,  // a = event slot, b = generation
  kEventWait = 5,    // a = event slot, b = generation
  kWaitValue = 6,    // a = pinned host address, b = value (orStreamWaitValue32)
  kCopyInline = 7,   // a = dst, params[bytes]: host bytes carried in the slot
};

struct SlotHeader {
  uint32_t command;
  uint32_t function;  // kLaunch: function id
  uint64_t bytes;     // kLaunch, kCopyInline: parameter bytes
  uint64_t a, b, c;
};

struct Slot {
  SlotHeader h;
  char params[OR_MAX_KERNEL_PARAMS];
};

struct alignas(64) Ring {
  alignas(64) std::atomic<uint64_t> tail{0};       // host writes
  std::atomic<uint32_t> worker_sleeping{0};        // device writes
  alignas(64) std::atomic<uint64_t> completed{0};  // device writes
  // The smallest count a host thread sleeps waiting for (UINT64_MAX: none).
  // Waiters lower it; the device, once `completed` reaches it, resets it and
  // wakes every waiter (those still short of their count lower it again), so
  // a host waiting for room in a full ring, or for a synchronization, wakes
  // once, not at every command the device finishes.
  std::atomic<uint64_t> host_wake_at{UINT64_MAX};
  // Function id + 1 of the kernel running now (0: none), for the reason
  // of a lost device.
  std::atomic<uint32_t> running{0};
  // What that kernel said it does (orKernelContext::describe), "" if
  // nothing: the device writes it, the host reads it once the device
  // process has ended.
  char activity[kActivityBytes] = {};
  // The first failure since the host last read it: the worker moves
  // error_state 0 -> 1, writes code and message, then 1 -> 2; the host
  // reads at 2 and stores 0.
  alignas(64) std::atomic<uint32_t> error_state{0};
  int32_t error_code = 0;
  // A kernel that failed without a message: its id and return value (the
  // host names it).
  int32_t error_function = -1;
  int32_t error_status = 0;
  char error_activity[kActivityBytes] = {};  // its describe() text
  char error_message[kMessageBytes];
  // Warnings (orKernelContext::warn): the worker writes slot warn_written %
  // OR_MAX_PENDING_WARNINGS, then advances warn_written; the host copies the
  // slots up to it, then advances warn_read. When the host is
  // OR_MAX_PENDING_WARNINGS behind, the worker counts warn_dropped instead.
  alignas(64) std::atomic<uint64_t> warn_written{0};
  std::atomic<uint64_t> warn_read{0};
  std::atomic<uint64_t> warn_dropped{0};
  char warnings[OR_MAX_PENDING_WARNINGS][OR_MAX_WARNING_BYTES];
  Slot slots[kRingSlots];
};

enum Request : uint32_t {
  kLoadModule = 1,    // arg0 = module id, text = path
  kGetFunction = 2,   // arg0 = module id, arg1 = function id, text = name
  kUnloadModule = 3,  // arg0 = module id
  kStartStream = 4,   // arg0 = ring
  kStopStream = 5,    // arg0 = ring (its commands have completed)
  // Maps memory another user process exported (orIpcOpenMemHandle): arg0 =
  // import slot, text = a path of the exporter's arena file that this
  // process can open, value[0] = page-aligned offset in that file, value[1]
  // = length, value[2] = the user process's address of that offset.
  kMapImport = 6,
  kUnmapImport = 7,  // arg0 = import slot
};

struct Control {
  uint32_t magic;
  int32_t device;
  int32_t device_count;
  int32_t parent_pid;
  uint64_t arena_base[kMaxDevices];  // the user process's device views
  uint64_t arena_capacity;
  uint64_t pinned_base;  // the user process's pinned pool
  uint64_t pinned_capacity;
  std::atomic<uint32_t> ready;  // the device process sets it to 1
  // Nonzero when a ring may hold warnings the host has not taken: the
  // worker adds one after each warning, the host swaps in 0 before it
  // reads the rings.
  alignas(64) std::atomic<uint32_t> warnings_pending;
  // Threads of the user process blocked in a wait for any device (the
  // host's cores are one pool that every device process shares with the
  // host's own work): the device's kernels see it through
  // orKernelContext::team_threads. The host stores the count in every
  // device's block at each change (openreg_rt::HostWaiting).
  alignas(64) std::atomic<int32_t> host_waiting;

  // Requests: one at a time (the host serializes them). The host writes the
  // request, then increments request_seq; the device answers, then sets
  // response_seq to the same value.
  alignas(64) std::atomic<uint32_t> request_seq;
  alignas(64) std::atomic<uint32_t> response_seq;
  uint32_t request;
  int32_t arg0;
  int32_t arg1;
  uint64_t value[3];
  int32_t status;  // orError_t of the answer
  char text[4096];
  char answer[kMessageBytes];  // why a request failed (dlerror)

  Ring rings[kMaxStreams];
};

struct alignas(64) EventSlot {
  std::atomic<uint64_t> completed;  // generation of the latest finished record
  uint64_t timestamp_ns;            // CLOCK_MONOTONIC at that record
  std::atomic<uint32_t> waiters;    // threads futex-waiting on `completed`
};

struct Events {
  EventSlot slots[kMaxEvents];
};

// Waits while the 32-bit word at `word` (the low half of a counter) equals
// `expected`, at most `timeout_ms`; spurious returns are fine (callers loop).
inline void futex_wait(const void* word, uint32_t expected, long timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// futex_wait without a timeout: until a futex_wake (or a signal).
inline void futex_wait_untimed(const void* word, uint32_t expected) {
  syscall(SYS_futex, word, FUTEX_WAIT, expected, nullptr, nullptr, 0);
}

// Wakes every thread of any process waiting on `word`.
inline void futex_wake(const void* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// orStreamWaitValue32's condition (CU_STREAM_WAIT_VALUE_GEQ): `word` is at
// least `value`, modulo 2^32.
inline bool value_reached(uint32_t word, uint32_t value) {
  return static_cast<int32_t>(word - value) >= 0;
}
// How long a stream waiting on a value sleeps before it reads the word again
// when no wake-up comes (the host stored it without orHostWriteValue32).
constexpr long kValuePollMs = 1;

}  // namespace openreg_proc
