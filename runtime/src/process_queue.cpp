// The process driver's commands (see process_driver.cpp for the device
// processes): each stream is a command ring in its device's control block,
// single producer (the host, under the stream's lock), single consumer (the
// stream's worker in the device process); launches, copies (pinned memory
// directly, pageable memory staged through the pinned pool), memsets and
// event records and waits are commands; the host waits on the ring's
// completion counter, and a lost device ends every wait.
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "bulk_copy.h"
#include "process_internal.h"

namespace openreg_rt {
namespace proc {

using namespace openreg_proc;

namespace {

using Clock = std::chrono::steady_clock;

// Bytes of each pinned-pool staging chunk for copies from and to pageable
// host memory (at least the copy engine's bulk size, so that both sides copy
// a large transfer's chunks on every core); a staging block holds
// kStagingChunks of them.
constexpr size_t kStagingBytes = size_t{16} << 20;
constexpr size_t kStagingChunks = 2;
constexpr size_t kStagingBlockBytes = kStagingChunks * kStagingBytes;
// Staging blocks kept for the next copies (several host threads may copy at
// once); more are freed when their copy ends.
constexpr size_t kKeptStagingBlocks = 2;

}  // namespace

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
  stream->proc_ring_ = ring;
  // The device process starts the ring's worker at the stream's first
  // command (push): the PyTorch layer creates its pools' streams, 72 per
  // device, at the device's first use, and most of them never run anything.
  return orSuccess;
}

void stream_destroy(orStream* stream) {
  ProcessDevice& pd = of(stream->device());
  if (stream->proc_ring_ <= 0) {
    return;
  }
  bool started = false;
  {
    std::lock_guard<std::mutex> lock(stream->proc_mu_);
    started = stream->proc_started_;
  }
  if (!started ||
      request(pd, kStopStream, stream->proc_ring_, 0, nullptr) == orSuccess) {
    std::lock_guard<std::mutex> lock(pd.rings_mu);
    pd.ring_used[stream->proc_ring_] = false;
  }  // else the device is lost: its ring is never reused
  stream->proc_ring_ = -1;
}

namespace {

// Waits until the ring has completed `target` commands; orErrorDeviceLost if
// the device process ends first.
// It spins briefly first when only the last command is awaited (a
// synchronization after a short kernel: waking a sleeping thread costs more
// than the kernel often does), as the thread driver's waits do; a wait for
// more (room in a full ring, a long backlog) sleeps at once.
orError_t wait_ring(Device* dev, Ring& ring, uint64_t target,
                    bool interruptible) {
  if (ring.completed.load(std::memory_order_acquire) >= target) {
    return orSuccess;
  }
  const openreg_rt::HostWaiting waiting;
  if (target - ring.completed.load(std::memory_order_acquire) <= 1) {
    const auto spin_until = Clock::now() + std::chrono::microseconds(20);
    int n = 0;
    while (ring.completed.load(std::memory_order_acquire) < target) {
      openreg_rt::cpu_relax();
      if ((++n & 63) == 0 && Clock::now() > spin_until) {
        break;
      }
    }
  }
  LongWait long_wait(dev, interruptible);
  auto slice_end = Clock::now() + kWaitSlice;
  while (ring.completed.load(std::memory_order_acquire) < target) {
    OR_RETURN_IF_ERROR(check_not_lost(dev));
    if (Clock::now() >= slice_end) {
      OR_RETURN_IF_ERROR(long_wait.tick());
      slice_end = Clock::now() + kWaitSlice;
    }
    // Ask to be woken at `target` (the smallest count any waiter wants).
    uint64_t at = ring.host_wake_at.load(std::memory_order_seq_cst);
    while (target < at && !ring.host_wake_at.compare_exchange_weak(
                              at, target, std::memory_order_seq_cst)) {
    }
    const uint64_t seen = ring.completed.load(std::memory_order_seq_cst);
    if (seen < target) {
      futex_wait(&ring.completed, static_cast<uint32_t>(seen),
                 kWaitSlice.count());
    }
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
  if (!stream->proc_started_) {
    // The stream's first command: the device process starts its worker.
    OR_RETURN_IF_ERROR(
        request(of(dev), kStartStream, stream->proc_ring_, 0, nullptr));
    stream->proc_started_ = true;
  }
  const uint64_t t = stream->proc_tail_;
  // The slot is free once the command one lap back has completed. When it
  // is not, wait for a quarter of the ring to drain, not just this slot: a
  // host far ahead of the device then sleeps once per kRingRefill commands
  // and fills the ring again, rather than waiting at every launch for one
  // more command to finish (which kept the host 3/4 of a ring ahead, each
  // launch spinning: the Llama loop's backward took 9 ms of host CPU a step
  // instead of 2.5).
  //
  // The device process writes the completed count at every command: read
  // at every launch, its cache line crossed cores each time (a miss on the
  // host's path of a small kernel). The host keeps the count it last read
  // and reads the ring's only when that one no longer frees the slot: once
  // a lap when the device keeps up.
  uint64_t& seen = stream->proc_completed_seen_;
  if (t >= kRingSlots && seen < t - kRingSlots + 1) {
    seen = ring.completed.load(std::memory_order_acquire);
    if (seen < t - kRingSlots + 1) {
      const uint64_t target = t - kRingSlots + 1 + kRingRefill;
      OR_RETURN_IF_ERROR(wait_ring(dev, ring, target, false));
      seen = target;  // a lower bound, as the count only grows
    }
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

orError_t stream_synchronize(orStream* stream, bool interruptible) {
  Device* dev = stream->device();
  Ring& ring = of(dev).control->rings[stream->proc_ring_];
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(stream->proc_mu_);
    target = stream->proc_tail_;
  }
  OR_RETURN_IF_ERROR(wait_ring(dev, ring, target, interruptible));
  if (ring.error_state.load(std::memory_order_acquire) == 2) {
    const auto code = static_cast<orError_t>(ring.error_code);
    std::string message = ring.error_message;
    if (message.empty() && ring.error_function >= 0) {
      std::lock_guard<std::mutex> lock(shared().names_mu);
      const auto id = static_cast<size_t>(ring.error_function);
      if (id < shared().function_names.size()) {
        message = failed_kernel_message(shared().function_names[id],
                                        ring.error_activity, ring.error_status);
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

// Queues a copy on `stream`; `*done_at` is the count of the stream's ring at
// which it has run.
orError_t queue_copy(orStream* stream, const void* dst, const void* src,
                     size_t count, uint64_t* done_at) {
  SlotHeader h{};
  h.command = kCopy;
  h.a = reinterpret_cast<uint64_t>(dst);
  h.b = reinterpret_cast<uint64_t>(src);
  h.c = count;
  uint64_t ticket = 0;
  OR_RETURN_IF_ERROR(push(stream, h, nullptr, 0, &ticket));
  *done_at = ticket + 1;
  return orSuccess;
}

orError_t wait_stream_at(orStream* stream, uint64_t count) {
  Device* dev = stream->device();
  return wait_ring(dev, of(dev).control->rings[stream->proc_ring_], count,
                   false);
}

// [doc:pageable-staging]
// Pageable host memory: the device cannot reach it, so the copy is staged
// through the pinned pool, as a real driver does, in chunks through
// kStagingChunks buffers: the host fills (or drains) one while the device
// copies another, and both sides copy with the copy engine (bulk_copy.cpp).
// 64 MB on two cores: 5 GB/s with one 4 MB buffer and memcpy, 11-15 GB/s
// so. Synchronous, as CUDA's copies from and to pageable memory are for the
// host. The buffers are kept for the next copy (at most kKeptStagingBlocks
// blocks; only the pages copies touched are resident): freed, their pages
// would leave the pool (pinned_free) and the next copy would fault them in
// again, in this process and in the device's (30 us for the 64 bytes of a
// small tensor's .cpu(), 2.6 us kept).
orError_t take_staging(char** block) {
  PinnedPool& pool = shared().pinned;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.staging.empty()) {
      *block = pool.staging.back();
      pool.staging.pop_back();
      return orSuccess;
    }
  }
  void* p = nullptr;
  OR_RETURN_IF_ERROR(pinned_alloc(kStagingBlockBytes, &p));
  *block = static_cast<char*>(p);
  return orSuccess;
}

void give_back_staging(char* block) {
  PinnedPool& pool = shared().pinned;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.staging.size() < kKeptStagingBlocks) {
      pool.staging.push_back(block);
      return;
    }
  }
  pinned_free(block);
}

orError_t staged_copy(orStream* stream, char* dst, const char* src,
                      size_t count, bool to_device) {
  const size_t chunk = std::min(count, kStagingBytes);
  const size_t chunks = (count + chunk - 1) / chunk;
  char* staging = nullptr;
  OR_RETURN_IF_ERROR(take_staging(&staging));
  // Chunk j goes through buffer j % kStagingChunks; done_at holds the ring
  // count at which the copy of the buffer's latest chunk has run.
  uint64_t done_at[kStagingChunks] = {};
  auto buffer = [&](size_t j) {
    return staging + j % kStagingChunks * kStagingBytes;
  };
  auto bytes = [&](size_t j) { return std::min(chunk, count - j * chunk); };
  // Device to host: the device has copied chunk j; copy it out.
  auto drain = [&](size_t j) {
    OR_RETURN_IF_ERROR(wait_stream_at(stream, done_at[j % kStagingChunks]));
    openreg_device::copy_bytes(dst + j * chunk, buffer(j), bytes(j));
    return orSuccess;
  };
  orError_t err = orSuccess;
  for (size_t j = 0; j < chunks && err == orSuccess; ++j) {
    uint64_t* at = &done_at[j % kStagingChunks];
    if (to_device) {
      // The device has read the buffer's previous chunk.
      if (j >= kStagingChunks) {
        err = wait_stream_at(stream, *at);
      }
      if (err == orSuccess) {
        openreg_device::copy_bytes(buffer(j), src + j * chunk, bytes(j));
        err = queue_copy(stream, dst + j * chunk, buffer(j), bytes(j), at);
      }
    } else {
      if (j >= kStagingChunks) {
        err = drain(j - kStagingChunks);
      }
      if (err == orSuccess) {
        err = queue_copy(stream, buffer(j), src + j * chunk, bytes(j), at);
      }
    }
  }
  // Every queued copy has run before the buffers go back to the pool.
  const uint64_t last = *std::max_element(done_at, done_at + kStagingChunks);
  const orError_t finished =
      last != 0 ? wait_stream_at(stream, last) : orSuccess;
  if (err == orSuccess) {
    err = finished;
  }
  if (!to_device) {
    for (size_t j = chunks - std::min(chunks, kStagingChunks);
         j < chunks && err == orSuccess; ++j) {
      err = drain(j);
    }
  }
  give_back_staging(staging);
  return err;
}
// [/doc:pageable-staging]

}  // namespace

// dst/src were validated by the caller: device sides are live ranges, host
// sides pinned or pageable. `stream` runs it; `wait` makes it synchronous.
orError_t copy(orStream* stream, void* dst, const void* src, size_t count,
               bool dst_is_device, bool src_is_device, bool wait) {
  if (count == 0) {
    return wait ? stream_synchronize(stream, false) : orSuccess;
  }
  if (!dst_is_device && !src_is_device && wait) {
    OR_RETURN_IF_ERROR(stream_synchronize(stream, false));
    std::memmove(dst, src, count);
    return orSuccess;
  }
  const bool dst_ok = dst_is_device || is_pinned(dst, count);
  const bool src_ok = src_is_device || is_pinned(src, count);
  if (dst_ok && src_ok) {
    uint64_t done_at = 0;
    OR_RETURN_IF_ERROR(queue_copy(stream, dst, src, count, &done_at));
    return wait ? wait_stream_at(stream, done_at) : orSuccess;
  }
  return staged_copy(stream, static_cast<char*>(dst),
                     static_cast<const char*>(src), count,
                     /*to_device=*/!src_ok);
}

orError_t copy_inline(orStream* stream, void* dst, const void* src,
                      size_t count) {
  static_assert(OR_MAX_INLINE_COPY_BYTES <= sizeof(Slot::params),
                "an inline copy's bytes must fit in a ring slot");
  SlotHeader h{};
  h.command = kCopyInline;
  h.a = reinterpret_cast<uint64_t>(dst);
  h.bytes = count;
  return push(stream, h, src, count);
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
  return wait_ring(dev, of(dev).control->rings[stream->proc_ring_], ticket + 1,
                   false);
}

// ---- events -----------------------------------------------------------

int event_slot_alloc(uint64_t* base) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.events_mu);
  if (s.free_events.empty()) {
    // Reclaim the slots whose last record has run (or never will).
    auto& retiring = s.retiring_events;
    size_t kept = 0;
    for (const Shared::RetiringEvent& r : retiring) {
      const bool lost = check_not_lost(r.dev) != orSuccess;
      if (r.ring < 0 || lost || ticket_done(r.dev, r.ring, r.ticket)) {
        if (lost) {
          event_force_complete(r.slot, r.generation);
        }
        s.free_events.push_back(r.slot);
      } else {
        retiring[kept++] = r;
      }
    }
    retiring.resize(kept);
  }
  if (s.free_events.empty()) {
    return -1;
  }
  const int slot = s.free_events.back();
  s.free_events.pop_back();
  EventSlot& e = s.events->slots[slot];
  // Not reset to 0: a wait another stream queued for the slot's previous
  // event may not have run yet, and must still find its generation reached.
  *base = e.completed.load(std::memory_order_acquire);
  e.timestamp_ns = 0;
  return slot;
}

void event_slot_free(int slot, const Device* dev, int ring, uint64_t ticket,
                     uint64_t generation) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.events_mu);
  s.retiring_events.push_back({slot, dev, ring, ticket, generation});
}

orError_t event_record(orStream* stream, int slot, uint64_t generation,
                       uint64_t* ticket) {
  SlotHeader h{};
  h.command = kEventRecord;
  h.a = static_cast<uint64_t>(slot);
  h.b = generation;
  return push(stream, h, nullptr, 0, ticket);
}

uint64_t progress(Device* dev, std::string* running) {
  ProcessDevice& pd = of(dev);
  uint64_t total = 0;
  for (int r = 0; r < kMaxStreams; ++r) {
    const Ring& ring = pd.control->rings[r];
    total += ring.completed.load(std::memory_order_acquire);
    if (running == nullptr || !running->empty()) {
      continue;
    }
    const uint32_t id = ring.running.load(std::memory_order_acquire);
    if (id != 0) {
      char activity[kActivityBytes];
      std::memcpy(activity, ring.activity, sizeof(activity));
      activity[sizeof(activity) - 1] = '\0';
      std::lock_guard<std::mutex> lock(shared().names_mu);
      if (id - 1 < shared().function_names.size()) {
        *running = kernel_label(shared().function_names[id - 1], activity);
      }
    }
  }
  return total;
}

bool ticket_done(const Device* dev, int ring, uint64_t ticket) {
  return of(dev).control->rings[ring].completed.load(
             std::memory_order_acquire) > ticket;
}

orError_t wait_ticket(Device* dev, int ring, uint64_t ticket,
                      bool interruptible) {
  return wait_ring(dev, of(dev).control->rings[ring], ticket + 1,
                   interruptible);
}

orError_t event_wait(orStream* stream, int slot, uint64_t generation) {
  SlotHeader h{};
  h.command = kEventWait;
  h.a = static_cast<uint64_t>(slot);
  h.b = generation;
  return push(stream, h, nullptr, 0);
}

orError_t wait_value(orStream* stream, const void* addr, uint32_t value) {
  SlotHeader h{};
  h.command = kWaitValue;
  h.a = reinterpret_cast<uint64_t>(addr);
  h.b = value;
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

}  // namespace proc
}  // namespace openreg_rt
