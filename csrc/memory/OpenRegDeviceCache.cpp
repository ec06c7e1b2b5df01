#include "memory/OpenRegDeviceCache.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <utility>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"
#include "memory/OpenRegAllocatorPolicy.h"

namespace openreg::allocator {

namespace {

using c10::CachingAllocator::for_each_selected_stat_type;
using c10::CachingAllocator::format_size;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingAllocator::StatTypes;

constexpr auto kAggregate = static_cast<size_t>(StatType::AGGREGATE);

// The statistics a block of `pool` counts in: the aggregate and its pool's.
StatTypes stat_types(const BlockPool& pool) {
  StatTypes types{};
  types[kAggregate] = true;
  types[static_cast<size_t>(pool.is_small ? StatType::SMALL_POOL
                                          : StatType::LARGE_POOL)] = true;
  return types;
}

void increase(StatArray& array, const BlockPool& pool, size_t amount) {
  for_each_selected_stat_type(stat_types(pool),
                              [&](size_t i) { array[i].increase(amount); });
}

void decrease(StatArray& array, const BlockPool& pool, size_t amount) {
  for_each_selected_stat_type(stat_types(pool),
                              [&](size_t i) { array[i].decrease(amount); });
}

bool can_merge(const Block* b) {
  return b != nullptr && !b->allocated && !b->recent && b->event_count == 0 &&
         b->stream_uses.empty();
}

}  // namespace

bool BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) {
    return a->stream < b->stream;
  }
  if (a->size != b->size) {
    return a->size < b->size;
  }
  return a->ptr < b->ptr;
}

Block* DeviceCache::malloc(size_t orig_size, c10::StreamId stream,
                           WhenFull when_full,
                           std::shared_ptr<c10::GatheredContext> context) {
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  const size_t size = round_size(orig_size);
  BlockPool& pool = is_small(size) ? small_ : large_;
  Block* block = pool.is_small ? take_recent(stream, size) : nullptr;
  if (block == nullptr) {
    block = take_free_block(pool, stream, size);
    if (block == nullptr && recent_count_ > 0) {
      flush_recent();  // merged, they may hold the request
      block = take_free_block(pool, stream, size);
    }
    if (block == nullptr) {
      check_settings();
      if (gc_enabled()) {
        garbage_collect();
      }
      block = new_segment(pool, stream, size, orig_size, when_full, context);
      if (block == nullptr) {
        return nullptr;
      }
    }
    block = maybe_split(block, size);
  }
  block->allocated = true;
  block->requested = orig_size;
  trace_.record(TraceEntry::ALLOC, device_,
                reinterpret_cast<uintptr_t>(block->ptr), orig_size, stream,
                context);
  block->context = std::move(context);
  increase(stats_.allocation, pool, 1);
  increase(stats_.allocated_bytes, pool, block->size);
  growth_.allocated(
      static_cast<size_t>(stats_.allocated_bytes[kAggregate].current));
  increase(stats_.active, pool, 1);
  increase(stats_.active_bytes, pool, block->size);
  increase(stats_.requested_bytes, pool, orig_size);
  if (is_oversize(block->size)) {
    stats_.oversize_allocations.increase(1);
  }
  return block;
}

void DeviceCache::fail_as_full(size_t size, c10::StreamId /*stream*/) {
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  flush_recent();
  release_cached_blocks();
  ++stats_.num_alloc_retries;
  ++stats_.num_ooms;
  raise_oom(size);
}

void DeviceCache::free(Block* block,
                       std::shared_ptr<c10::GatheredContext> context) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.record(TraceEntry::FREE_REQUESTED, device_,
                reinterpret_cast<uintptr_t>(block->ptr), block->requested,
                block->stream, std::move(context));
  block->context.reset();
  block->allocated = false;
  decrease(stats_.allocation, *block->pool, 1);
  decrease(stats_.allocated_bytes, *block->pool, block->size);
  growth_.freed(
      static_cast<size_t>(stats_.allocated_bytes[kAggregate].current));
  decrease(stats_.requested_bytes, *block->pool, block->requested);
  if (is_oversize(block->size)) {
    stats_.oversize_allocations.decrease(1);
  }
  block->requested = 0;
  if (!block->stream_uses.empty()) {
    insert_events(block);
    return;
  }
  free_completed(block);
  if (block->pool->is_small) {
    keep_recent(block);
  } else {
    free_block(block);
  }
}

// [doc:allocator-recent]
void DeviceCache::keep_recent(Block* block) {
  decrease(stats_.active, *block->pool, 1);
  decrease(stats_.active_bytes, *block->pool, block->size);
  // Marked first: merging the oldest must not take this block in.
  block->recent = true;
  if (recent_count_ == kRecentBlocks) {
    Block* oldest = recent_[0];
    std::move(recent_.begin() + 1, recent_.end(), recent_.begin());
    --recent_count_;
    oldest->recent = false;
    merge_free(oldest);
  }
  recent_[recent_count_++] = block;
}

Block* DeviceCache::take_recent(c10::StreamId stream, size_t size) {
  for (size_t i = recent_count_; i-- > 0;) {  // the newest first
    Block* b = recent_[i];
    if (b->stream == stream && b->size == size) {
      std::move(recent_.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                recent_.begin() + static_cast<std::ptrdiff_t>(recent_count_),
                recent_.begin() + static_cast<std::ptrdiff_t>(i));
      --recent_count_;
      b->recent = false;
      return b;
    }
  }
  return nullptr;
}

void DeviceCache::flush_recent() {
  // One at a time: a block still marked recent is not merged into its
  // neighbour (which would delete it while it is listed here); it takes the
  // neighbour in when its own turn comes.
  const size_t count = std::exchange(recent_count_, 0);
  for (size_t i = 0; i < count; ++i) {
    recent_[i]->recent = false;
    merge_free(recent_[i]);
  }
}
// [/doc:allocator-recent]

void DeviceCache::record_stream(Block* block, c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stream != block->stream) {
    block->stream_uses.insert(stream);
  }
}

void DeviceCache::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_recent();
  release_cached_blocks();
}

void DeviceCache::set_fraction(double fraction) {
  std::lock_guard<std::mutex> lock(mutex_);
  fraction_ = fraction;
  fraction_set_ = true;
}

double DeviceCache::fraction() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fraction_;
}

// Pool membership also decides the inactive_split statistics: a free block
// that shares its segment with others is an inactive split.
void DeviceCache::pool_insert(Block* b) {
  b->pool->blocks.insert(b);
  b->gc_base = b->pool->searches;
  if (b->is_split()) {
    increase(stats_.inactive_split, *b->pool, 1);
    increase(stats_.inactive_split_bytes, *b->pool, b->size);
  }
}

void DeviceCache::pool_erase(Block* b) {
  b->pool->blocks.erase(b);
  if (b->is_split()) {
    decrease(stats_.inactive_split, *b->pool, 1);
    decrease(stats_.inactive_split_bytes, *b->pool, b->size);
  }
}

Block* DeviceCache::take_free_block(BlockPool& pool, c10::StreamId stream,
                                    size_t size) {
  if (gc_enabled()) {
    ++pool.searches;  // ages every free block of the pool
  }
  Block key(device_, stream, size, &pool, nullptr);
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != stream ||
      !may_reuse((*it)->size, size)) {
    return nullptr;
  }
  Block* b = *it;
  pool_erase(b);
  return b;
}

// [doc:allocator-new-segment]
// Allocates a new segment from the runtime. When the device (or the
// per-process fraction) refuses, frees cached oversize blocks and retries,
// then frees the whole cache and retries, then raises
// torch.OutOfMemoryError (or returns nullptr, as `when_full` says).
Block* DeviceCache::new_segment(
    BlockPool& pool, c10::StreamId stream, size_t size, size_t orig_size,
    WhenFull when_full, const std::shared_ptr<c10::GatheredContext>& context) {
  // A segment never exceeds what the device (or the process's fraction of
  // it) can hold: on a small device (OPENREG_DEVICE_MEMORY=1M) a 2 MiB small
  // segment, or a 20 MiB large one, would fail every allocation; the block
  // itself is then the segment.
  size_t alloc_size = segment_size(size);
  if (alloc_size > allowed()) {
    alloc_size = size;
  }
  void* ptr = nullptr;
  orError_t err = try_malloc(alloc_size, &ptr);
  if (err == orErrorMemoryAllocation && when_full == WhenFull::kGiveUp) {
    return nullptr;
  }
  if (err == orErrorMemoryAllocation &&
      release_oversize_blocks(pool, stream, size)) {
    err = try_malloc(alloc_size, &ptr);
  }
  if (err == orErrorMemoryAllocation) {
    release_cached_blocks();
    ++stats_.num_alloc_retries;
    err = try_malloc(alloc_size, &ptr);
  }
  if (err == orErrorMemoryAllocation && when_full == WhenFull::kDefer) {
    return nullptr;
  }
  if (err == orErrorMemoryAllocation) {
    ++stats_.num_ooms;
    raise_oom(orig_size);
  }
  OPENREG_CHECK(err);
  ++stats_.num_device_alloc;
  auto* block =
      new Block(device_, stream, alloc_size, &pool, static_cast<char*>(ptr));
  trace_.record(TraceEntry::SEGMENT_ALLOC, device_,
                reinterpret_cast<uintptr_t>(ptr), alloc_size, stream, context);
  segments_.insert(block);
  increase(stats_.segment, pool, 1);
  increase(stats_.reserved_bytes, pool, alloc_size);
  if (is_oversize(alloc_size)) {
    stats_.oversize_segments.increase(1);
  }
  return block;
}
// [/doc:allocator-new-segment]

// garbage_collection_threshold applies once a memory fraction was set, as on
// CUDA: the threshold is a fraction of that limit.
bool DeviceCache::gc_enabled() const {
  return fraction_set_ && gc_threshold() > 0.0;
}

// Above the threshold, gives back whole free large-pool segments, the least
// recently freed (the oldest by pool searches) first, until enough is
// reclaimed. Cheaper for the program than the release of the whole cache
// that running out of memory causes.
void DeviceCache::garbage_collect() {
  const auto threshold =
      static_cast<size_t>(gc_threshold() * static_cast<double>(allowed()));
  if (reserved() <= threshold) {
    return;
  }
  const size_t target = reserved() - threshold;
  std::vector<Block*> candidates;
  size_t total_age = 0;
  for (Block* b : large_.blocks) {
    if (!b->is_split()) {
      candidates.push_back(b);
      total_age += large_.searches - b->gc_base;
    }
  }
  size_t reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && !candidates.empty()) {
    // Free every block at least as old as the average, then look again.
    const double average =
        static_cast<double>(total_age) / static_cast<double>(candidates.size());
    freed = false;
    for (auto it = candidates.begin(); it != candidates.end();) {
      Block* b = *it;
      const size_t age = large_.searches - b->gc_base;
      if (static_cast<double>(age) < average) {
        ++it;
        continue;
      }
      if (!freed) {
        synchronize_device(device_);  // queued kernels may use cached blocks
      }
      freed = true;
      reclaimed += b->size;
      total_age -= age;
      it = candidates.erase(it);
      release_block(b);
    }
  }
}

// max_split_size_mb: before the whole cache is freed, frees the smallest
// whole cached oversize segment of the stream that covers the request, or
// else whole oversize segments from the largest down until they cover it.
// Returns whether enough was freed.
bool DeviceCache::release_oversize_blocks(BlockPool& pool, c10::StreamId stream,
                                          size_t size) {
  const size_t max_split = Config::max_split_size();
  if (max_split == std::numeric_limits<size_t>::max()) {
    return false;  // no limit set: nothing is oversize
  }
  Block key(device_, stream, std::max(size, max_split), &pool, nullptr);
  const auto first = pool.blocks.lower_bound(&key);
  for (auto it = first; it != pool.blocks.end() && (*it)->stream == stream;
       ++it) {
    if (!(*it)->is_split()) {
      synchronize_device(device_);  // queued kernels may use cached blocks
      release_block(*it);
      return true;
    }
  }
  std::vector<Block*> victims;
  size_t released = 0;
  for (auto it = first; it != pool.blocks.begin() && released < key.size;) {
    --it;
    if ((*it)->stream != stream || !is_oversize((*it)->size)) {
      break;
    }
    if (!(*it)->is_split()) {
      victims.push_back(*it);
      released += (*it)->size;
    }
  }
  if (!victims.empty()) {
    synchronize_device(device_);
  }
  for (Block* b : victims) {
    release_block(b);
  }
  return released >= key.size;
}

size_t DeviceCache::free_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto allocated =
      static_cast<size_t>(stats_.allocated_bytes[kAggregate].current);
  const size_t limit = allowed();
  return limit > allocated ? limit - allocated : 0;
}

size_t DeviceCache::reserved() const {
  return static_cast<size_t>(stats_.reserved_bytes[kAggregate].current);
}

size_t DeviceCache::allowed() {
  return static_cast<size_t>(fraction_ * static_cast<double>(capacity()));
}

size_t DeviceCache::capacity() {
  if (capacity_ == 0) {
    ScopedDevice guard(device_);
    size_t free_bytes = 0;
    OPENREG_CHECK(orMemGetInfo(&free_bytes, &capacity_));
  }
  return capacity_;
}

orError_t DeviceCache::try_malloc(size_t alloc_size, void** ptr) {
  if (reserved() + alloc_size > allowed()) {
    return orErrorMemoryAllocation;
  }
  ScopedDevice guard(device_);
  return orMalloc(ptr, alloc_size);
}

void DeviceCache::raise_oom(size_t orig_size) {
  ScopedDevice guard(device_);
  size_t free_bytes = 0;
  size_t total = 0;
  OPENREG_CHECK(orMemGetInfo(&free_bytes, &total));
  // As CUDA's trace: "addr" holds the free bytes the device reports.
  trace_.record(TraceEntry::OOM, device_, free_bytes, orig_size, 0,
                gather_context(false));
  const auto allocated =
      static_cast<size_t>(stats_.allocated_bytes[kAggregate].current);
  std::ostringstream limit;
  if (fraction_ < 1.0) {
    limit << " The per-process memory fraction is " << fraction_ << " ("
          << format_size(
                 static_cast<size_t>(fraction_ * static_cast<double>(total)))
          << ").";
  }
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, "openreg out of memory. Tried to allocate ",
      format_size(orig_size), ". Device ", static_cast<int>(device_),
      " has a total capacity of ", format_size(total), " of which ",
      format_size(free_bytes), " is free. Of the allocated memory ",
      format_size(allocated), " is allocated by PyTorch, and ",
      format_size(reserved() - allocated),
      " is reserved by PyTorch but unallocated.", limit.str(),
      growth_.report(
          total, static_cast<size_t>(stats_.allocated_bytes[kAggregate].peak),
          [](size_t n) { return format_size(n); }),
      " Set OPENREG_DEVICE_MEMORY to simulate a larger device.");
}

Block* DeviceCache::maybe_split(Block* block, size_t size) {
  if (!should_split(block->pool->is_small, block->size, size)) {
    return block;
  }
  auto* rest = new Block(device_, block->stream, block->size - size,
                         block->pool, block->ptr + size);
  rest->prev = block;
  rest->next = block->next;
  if (rest->next != nullptr) {
    rest->next->prev = rest;
  }
  block->next = rest;
  block->size = size;
  pool_insert(rest);
  return block;
}

void DeviceCache::insert_events(Block* block) {
  ScopedDevice guard(device_);
  for (c10::StreamId id : block->stream_uses) {
    orEvent_t event = nullptr;
    OPENREG_CHECK(orEventCreateWithFlags(&event, orEventDisableTiming));
    const c10::Stream stream(c10::Stream::UNSAFE,
                             c10::Device(c10::DeviceType::PrivateUse1, device_),
                             id);
    OPENREG_CHECK(orEventRecord(event, native_stream(stream)));
    ++block->event_count;
    events_.emplace_back(event, block);
  }
  block->stream_uses.clear();
}

// Returns blocks whose streams have passed their last use, in order.
void DeviceCache::process_events() {
  while (!events_.empty()) {
    auto [event, block] = events_.front();
    orError_t err = orEventQuery(event);
    if (err == orErrorNotReady) {
      break;
    }
    OPENREG_CHECK(err);
    events_.pop_front();
    OPENREG_CHECK(orEventDestroy(event));
    if (--block->event_count == 0) {
      free_completed(block);
      free_block(block);
    }
  }
}

void DeviceCache::synchronize_and_free_events() {
  ++stats_.num_sync_all_streams;
  while (!events_.empty()) {
    auto [event, block] = events_.front();
    events_.pop_front();
    synchronize_event(event);
    OPENREG_CHECK(orEventDestroy(event));
    if (--block->event_count == 0) {
      free_completed(block);
      free_block(block);
    }
  }
}

// A block no longer in use returns to its pool, merged with free neighbours.
void DeviceCache::free_completed(const Block* block) {
  trace_.record(TraceEntry::FREE_COMPLETED, device_,
                reinterpret_cast<uintptr_t>(block->ptr), block->size,
                block->stream, nullptr);
}

void DeviceCache::free_block(Block* block) {
  decrease(stats_.active, *block->pool, 1);
  decrease(stats_.active_bytes, *block->pool, block->size);
  merge_free(block);
}

// Merges a free, inactive block with its free neighbours and returns it to
// its pool.
void DeviceCache::merge_free(Block* block) {
  if (can_merge(block->prev)) {
    Block* prev = block->prev;
    pool_erase(prev);
    if (segments_.erase(prev) != 0) {
      segments_.insert(block);
    }
    block->ptr = prev->ptr;
    block->size += prev->size;
    block->prev = prev->prev;
    if (block->prev != nullptr) {
      block->prev->next = block;
    }
    delete prev;
  }
  if (can_merge(block->next)) {
    Block* next = block->next;
    pool_erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next != nullptr) {
      block->next->prev = block;
    }
    delete next;
  }
  pool_insert(block);
}

// Gives a whole free segment back to the runtime. The caller has drained the
// device: kernels still queued may use a cached block (a block freed on the
// host is reused in stream order), as cudaFree waits for the device.
void DeviceCache::release_block(Block* b) {
  trace_.record(TraceEntry::SEGMENT_FREE, device_,
                reinterpret_cast<uintptr_t>(b->ptr), b->size, b->stream,
                gather_context(true));
  pool_erase(b);
  segments_.erase(b);
  OPENREG_CHECK(orFree(b->ptr));
  ++stats_.num_device_free;
  decrease(stats_.segment, *b->pool, 1);
  decrease(stats_.reserved_bytes, *b->pool, b->size);
  if (is_oversize(b->size)) {
    stats_.oversize_segments.decrease(1);
  }
  delete b;
}

// Gives every whole free segment back to the runtime.
void DeviceCache::release_cached_blocks() {
  synchronize_device(device_);  // raises a pending kernel error, if any
  synchronize_and_free_events();
  for (BlockPool* pool : {&small_, &large_}) {
    for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
      Block* b = *it;
      ++it;
      if (!b->is_split()) {
        release_block(b);
      }
    }
  }
}

}  // namespace openreg::allocator
