// What the device cache reports (OpenRegDeviceCache.h): statistics and
// their resets, the owner of an address, snapshots. Each merges the recently
// freed blocks first, so it reports the cache as if they had been merged at
// their free.
#include <utility>
#include <vector>

#include "memory/OpenRegAllocatorPolicy.h"
#include "memory/OpenRegDeviceCache.h"

namespace openreg::allocator {

namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;

// Every statistic of DeviceStats this allocator keeps, in one table for the
// resets (c10 offers no walk over DeviceStats's fields). Private memory pools
// (reserved_bytes_by_private_pools) do not exist here.
constexpr StatArray Stats::*kStatArrays[] = {
    &Stats::allocation,      &Stats::segment,
    &Stats::active,          &Stats::inactive_split,
    &Stats::allocated_bytes, &Stats::reserved_bytes,
    &Stats::active_bytes,    &Stats::inactive_split_bytes,
    &Stats::requested_bytes,
};
constexpr Stat Stats::*kSingleStats[] = {
    &Stats::oversize_allocations,
    &Stats::oversize_segments,
};
// Counters cleared by reset_accumulated_memory_stats, as on CUDA.
constexpr int64_t Stats::*kCounters[] = {
    &Stats::num_alloc_retries,    &Stats::num_ooms,
    &Stats::num_sync_all_streams, &Stats::num_device_alloc,
    &Stats::num_device_free,
};

template <typename F>
void for_each_stat(Stats& stats, F&& f) {
  for (StatArray Stats::*array : kStatArrays) {
    for (Stat& s : stats.*array) {
      f(s);
    }
  }
  for (Stat Stats::*single : kSingleStats) {
    f(stats.*single);
  }
}

}  // namespace

Stats DeviceCache::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_recent();
  // As CUDA reports it: the limit in bytes, -1 when there is none.
  stats_.max_split_size = static_cast<int64_t>(Config::max_split_size());
  return stats_;
}

void DeviceCache::reset_accumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_recent();
  for_each_stat(stats_, [](Stat& s) { s.reset_accumulated(); });
  for (int64_t Stats::*counter : kCounters) {
    stats_.*counter = 0;
  }
}

void DeviceCache::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_recent();
  for_each_stat(stats_, [](Stat& s) { s.reset_peak(); });
}

bool DeviceCache::find(const void* p, const char** begin, size_t* size,
                       bool* allocated) {
  const auto* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  flush_recent();
  for (Block* head : segments_) {
    for (Block* b = head; b != nullptr; b = b->next) {
      if (c >= b->ptr && c < b->ptr + b->size) {
        *begin = b->ptr;
        *size = b->allocated ? b->requested : b->size;
        *allocated = b->allocated;
        return true;
      }
    }
  }
  return false;
}

std::vector<TraceEntry> DeviceCache::traces() {
  std::lock_guard<std::mutex> lock(mutex_);
  return trace_.entries();
}

void DeviceCache::clear_traces() {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.clear();
}

std::vector<c10::CachingDeviceAllocator::SegmentInfo> DeviceCache::snapshot() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_recent();
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> out;
  for (Block* head : segments_) {
    c10::CachingDeviceAllocator::SegmentInfo seg;
    seg.device = device_;
    seg.address = reinterpret_cast<uintptr_t>(head->ptr);
    seg.stream = reinterpret_cast<void*>(static_cast<intptr_t>(head->stream));
    seg.is_large = !head->pool->is_small;
    for (Block* b = head; b != nullptr; b = b->next) {
      c10::CachingDeviceAllocator::BlockInfo info;
      info.size = b->size;
      info.requested_size = b->requested;
      info.allocated = b->allocated;
      info.active = b->allocated || b->event_count > 0;
      info.context_when_allocated = b->context;
      seg.total_size += b->size;
      if (info.allocated) {
        seg.allocated_size += b->size;
        seg.requested_size += b->requested;
      }
      if (info.active) {
        seg.active_size += b->size;
      }
      seg.blocks.push_back(std::move(info));
    }
    out.push_back(std::move(seg));
  }
  return out;
}

}  // namespace openreg::allocator
