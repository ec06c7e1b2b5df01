// Events: markers recorded into a stream's queue.
#include <chrono>
#include <set>

#include "process_protocol.h"
#include "runtime_internal.h"

using namespace openreg_rt;

namespace {

using Clock = std::chrono::steady_clock;

// Shared between the handle and the tasks that record into it, so destroying
// an event with a record still queued is safe.
struct EventState {
  std::mutex mu;  // guards the fields below
  std::condition_variable cv;
  uint64_t recorded = 0;  // version of the latest orEventRecord
  // Versions recorded but not completed yet. Records on different streams
  // may complete out of order, so "a later version finished" does not mean
  // an earlier one did: each waiter waits for its own version.
  std::set<uint64_t> pending;
  uint64_t latest_done = 0;  // highest version whose work has finished
  Clock::time_point when;    // completion time of `latest_done`

  bool done_locked(uint64_t version) const {
    return pending.count(version) == 0;
  }
};

}  // namespace

struct orEvent {
  Device* dev;
  bool timing;
  std::shared_ptr<EventState> state;
  // Process driver: the event's slot in the shared event table, and the
  // generation of its latest record (under state->mu).
  int slot = -1;
  int ring = -1;        // of the latest record (-1: never recorded)
  uint64_t ticket = 0;  // its command number in that ring
};

namespace {

// Live events of the process driver, to complete those of a lost device.
struct EventRegistry {
  std::mutex mu;
  std::set<orEvent*> events;
};

EventRegistry& registry() {
  static auto* r = new EventRegistry();  // leaked: used until exit
  return *r;
}

}  // namespace

namespace openreg_rt {

void complete_events_of(Device* dev) {
  EventRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (orEvent* ev : r.events) {
    if (ev->dev == dev) {
      std::lock_guard<std::mutex> state_lock(ev->state->mu);
      proc::event_force_complete(ev->slot, ev->state->recorded);
    }
  }
}

}  // namespace openreg_rt

namespace {

// A word orStreamWaitValue32 may wait on: 4-byte aligned pinned host memory,
// which every device (process) can read.
bool is_value_word(const void* addr) {
  return addr != nullptr &&
         reinterpret_cast<uintptr_t>(addr) % alignof(uint32_t) == 0 &&
         openreg_rt::host_range_is_pinned(addr, sizeof(uint32_t));
}

}  // namespace

extern "C" {

orError_t orEventCreateWithFlags(orEvent_t* event, unsigned int flags) {
  if (event == nullptr) {
    return orErrorInvalidValue;
  }
  *event = nullptr;
  if ((flags & ~static_cast<unsigned int>(orEventDisableTiming)) != 0) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  auto* created = new orEvent{device_at(current_device()),
                              (flags & orEventDisableTiming) == 0,
                              std::make_shared<EventState>()};
  if (process_driver()) {
    // Generations continue from the slot's previous events (under the new
    // event's own count, recorded > base means "recorded at least once").
    created->slot = proc::event_slot_alloc(&created->state->recorded);
    if (created->slot < 0) {
      delete created;
      return orErrorMemoryAllocation;
    }
    EventRegistry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.events.insert(created);
  }
  *event = created;
  return orSuccess;
}

orError_t orEventCreate(orEvent_t* event) {
  return orEventCreateWithFlags(event, orEventDefault);
}

orError_t orEventDestroy(orEvent_t event) {
  if (event == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  if (event->slot >= 0) {
    {
      EventRegistry& r = registry();
      std::lock_guard<std::mutex> lock(r.mu);
      r.events.erase(event);
    }
    // A record still queued writes the slot later: the slot is reused only
    // once it has run, and the caller does not wait for it.
    std::lock_guard<std::mutex> lock(event->state->mu);
    proc::event_slot_free(event->slot, event->dev, event->ring, event->ticket,
                          event->state->recorded);
  }
  delete event;
  return orSuccess;
}

orError_t orEventRecord(orEvent_t event, orStream_t stream) {
  if (event == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  if (stream == nullptr) {
    stream = device_at(current_device())->default_stream;
  }
  if (stream->device() != event->dev) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(check_not_lost(event->dev));
  if (event->slot >= 0) {
    // The generation is taken and pushed under the event's lock, so the
    // records of one event reach the rings in generation order.
    std::lock_guard<std::mutex> lock(event->state->mu);
    const uint64_t generation = event->state->recorded + 1;
    uint64_t ticket = 0;
    OR_RETURN_IF_ERROR(
        proc::event_record(stream, event->slot, generation, &ticket));
    event->state->recorded = generation;
    event->ring = stream->proc_ring_;
    event->ticket = ticket;
    return orSuccess;
  }
  std::shared_ptr<EventState> st = event->state;
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    version = ++st->recorded;
    st->pending.insert(version);
  }
  // A marker: the event completes in the same step as the stream counts the
  // record done. Lock order: stream lock, then event lock (nothing takes
  // them the other way round).
  const orError_t err = stream->enqueue_marker([st, version] {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->pending.erase(version);
      if (version > st->latest_done) {
        st->latest_done = version;
        st->when = Clock::now();
      }
    }
    st->cv.notify_all();
  });
  if (err != orSuccess) {
    std::lock_guard<std::mutex> lock(st->mu);
    st->pending.erase(version);  // never recorded (the device was lost)
  }
  return err;
}

orError_t orEventQuery(orEvent_t event) {
  if (event == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  OR_RETURN_IF_ERROR(check_not_lost(event->dev));
  std::lock_guard<std::mutex> lock(event->state->mu);
  if (event->slot >= 0) {
    return event->ring < 0 ||
                   proc::ticket_done(event->dev, event->ring, event->ticket)
               ? orSuccess
               : orErrorNotReady;
  }
  return event->state->done_locked(event->state->recorded) ? orSuccess
                                                           : orErrorNotReady;
}

orError_t orEventSynchronize(orEvent_t event) {
  if (event == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  EventState& st = *event->state;
  if (event->slot >= 0) {
    int ring = -1;
    uint64_t ticket = 0;
    {
      std::lock_guard<std::mutex> lock(st.mu);
      ring = event->ring;
      ticket = event->ticket;
    }
    if (ring >= 0) {
      OR_RETURN_IF_ERROR(proc::wait_ticket(event->dev, ring, ticket,
                                           /*interruptible=*/true));
    }
    return check_not_lost(event->dev);
  }
  {
    const openreg_rt::HostWaiting waiting;
    std::unique_lock<std::mutex> lock(st.mu);
    const uint64_t target = st.recorded;
    const auto done = [&] { return st.done_locked(target); };
    openreg_rt::LongWait long_wait(event->dev, /*interruptible=*/true);
    while (!st.cv.wait_for(lock, openreg_rt::kWaitSlice, done)) {
      lock.unlock();
      const orError_t err = long_wait.tick();
      lock.lock();
      if (err != orSuccess && !done()) {
        return err;
      }
    }
  }
  return check_not_lost(event->dev);
}

orError_t orStreamWaitEvent(orStream_t stream, orEvent_t event) {
  if (event == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  if (stream == nullptr) {
    stream = device_at(current_device())->default_stream;
  }
  if (event->slot >= 0) {
    uint64_t target = 0;
    {
      std::lock_guard<std::mutex> lock(event->state->mu);
      target = event->state->recorded;
    }
    if (proc::event_completed(event->slot) >= target) {
      return orSuccess;  // nothing pending: no wait needed
    }
    return proc::event_wait(stream, event->slot, target);
  }
  std::shared_ptr<EventState> st = event->state;
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    target = st->recorded;
    if (st->done_locked(target)) {
      return orSuccess;  // nothing pending: no wait needed
    }
  }
  return stream->enqueue([st, target] {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->done_locked(target); });
  });
}

// [doc:stream-wait-value]
orError_t orStreamWaitValue32(orStream_t stream, void* addr, uint32_t value,
                              unsigned int flags) {
  OR_RETURN_IF_ERROR(ensure_init());
  if (flags != 0 || !is_value_word(addr)) {
    return orErrorInvalidValue;
  }
  if (stream == nullptr) {
    stream = device_at(current_device())->default_stream;
  }
  if (process_driver()) {
    return proc::wait_value(stream, addr, value);
  }
  auto* word = static_cast<uint32_t*>(addr);
  return stream->enqueue([word, value, dev = stream->device()] {
    // A lost device runs nothing more: its waits end.
    for (;;) {
      const uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (openreg_proc::value_reached(seen, value) ||
          dev->lost.load(std::memory_order_acquire)) {
        return;
      }
      openreg_proc::futex_wait(word, seen, openreg_proc::kValuePollMs);
    }
  });
}

orError_t orHostWriteValue32(void* addr, uint32_t value) {
  OR_RETURN_IF_ERROR(ensure_init());
  if (!is_value_word(addr)) {
    return orErrorInvalidValue;
  }
  __atomic_store_n(static_cast<uint32_t*>(addr), value, __ATOMIC_RELEASE);
  // Pinned memory is shared with the device processes (the process
  // driver): a shared futex wakes their waiting workers too.
  openreg_proc::futex_wake(addr);
  return orSuccess;
}
// [/doc:stream-wait-value]

orError_t orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end) {
  if (ms == nullptr) {
    return orErrorInvalidValue;
  }
  if (start == nullptr || end == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  if (!start->timing || !end->timing) {
    return orErrorInvalidEventTiming;
  }
  if (start->slot >= 0) {
    uint64_t stamps[2] = {0, 0};
    int i = 0;
    for (orEvent_t ev : {start, end}) {
      std::lock_guard<std::mutex> lock(ev->state->mu);
      if (ev->ring < 0) {  // never recorded
        return orErrorInvalidEventTiming;
      }
      if (!proc::ticket_done(ev->dev, ev->ring, ev->ticket)) {
        return orErrorNotReady;
      }
      stamps[i++] = proc::event_timestamp_ns(ev->slot);
    }
    *ms = static_cast<float>(static_cast<double>(stamps[1]) -
                             static_cast<double>(stamps[0])) /
          1e6f;
    return orSuccess;
  }
  Clock::time_point t0;
  Clock::time_point t1;
  for (auto [ev, out] : {std::pair{start, &t0}, std::pair{end, &t1}}) {
    std::lock_guard<std::mutex> lock(ev->state->mu);
    if (ev->state->recorded == 0) {
      return orErrorInvalidEventTiming;
    }
    if (!ev->state->done_locked(ev->state->recorded)) {
      return orErrorNotReady;
    }
    *out = ev->state->when;
  }
  *ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
  return orSuccess;
}

orError_t orEventGetDevice(orEvent_t event, int* device) {
  if (event == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  if (device == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  *device = event->dev->index;
  return orSuccess;
}

}  // extern "C"
