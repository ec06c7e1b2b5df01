// The allocation history of the caching allocator, for memory snapshots
// (torch.openreg.memory._record_memory_history / _snapshot, the same calls
// as torch.cuda.memory's, which the CUDA migration shim maps here).
//
// While recording is on, each device's cache keeps the last `max_entries`
// of its actions (allocations, frees, segments taken from and given back to
// the runtime, out-of-memory errors) with the stack that caused them, and
// every live block keeps the stack that allocated it. The stacks are
// gathered by a function the Python layer installs (Python frames, and C++
// ones if asked), before the cache's lock is taken, and never on a stream
// worker (no Python runs there).
//
// Thread-safety: the settings are atomics, read on every allocation (one
// relaxed load when recording is off); a device's trace is guarded by its
// cache's mutex.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

namespace openreg::allocator {

using c10::CachingDeviceAllocator::CreateContextFn;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;

// What to record from now on. `trace`: keep trace entries (else only the
// stacks of live blocks, "state"); `when`: which actions get a stack;
// `recorder`: gathers one (nullptr: recording off).
struct HistorySettings {
  bool trace = false;
  RecordContext when = RecordContext::NEVER;
  CreateContextFn recorder = nullptr;
  size_t max_entries = 0;
};
void set_history_settings(const HistorySettings& settings);

// The stack of the calling thread for an action, if one is recorded for it:
// for an allocation (`free` false) when recording at all, for a free only
// with RecordContext::ALL.
std::shared_ptr<c10::GatheredContext> gather_context(bool free);

// One device's trace (owned by its DeviceCache, under its mutex).
class Trace {
 public:
  // Appends an entry if trace entries are recorded.
  void record(TraceEntry::Action action, c10::DeviceIndex device, size_t addr,
              size_t size, c10::StreamId stream,
              std::shared_ptr<c10::GatheredContext> context);
  void clear() { entries_.clear(); }
  std::vector<TraceEntry> entries() const {
    return {entries_.begin(), entries_.end()};
  }

 private:
  std::deque<TraceEntry> entries_;
};

}  // namespace openreg::allocator
