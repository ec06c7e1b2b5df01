// The per-device cache of the caching allocator: blocks, pools, segments,
// statistics, cross-stream frees, garbage collection and out of memory.
//
// Tensors come and go far faster than a driver allocation should be made, so
// freed blocks are kept and handed out again; the runtime (orMalloc/orFree) is
// called only to grow or shrink the cache. How sizes are rounded, which pool
// serves a request, and when blocks are split or reused is the policy of
// OpenRegAllocatorPolicy.h; a freed block merges with free neighbours of its
// segment.
//
// Recently freed small blocks: a program allocates and frees the same small
// sizes over and over (every op's result), and merging a freed block into
// its neighbours only to split the same block off again for the next request
// is most of an allocation's cost. So the last kRecentBlocks freed small
// blocks wait unmerged, outside the pools, and a request of exactly their
// size on their stream takes one back. Everything that looks at the pools or
// reports on them (statistics, snapshots, garbage collection, a new segment,
// empty_cache) merges them first, so what a user observes is what it would
// be without them.
//
// Streams: a block belongs to the stream it was allocated on and is reused on
// that stream at once (stream order makes that safe). If it was also used on
// other streams (Tensor.record_stream), freeing it records an event on each
// of them, and the block returns to the pool only once all have completed.
//
// Out of memory: when the runtime (or the per-process fraction) refuses a
// new segment, the cache frees oversize cached blocks (max_split_size_mb),
// then all cached blocks, retries, and then raises torch.OutOfMemoryError
// with the numbers a CUDA user expects.
//
// Thread-safety: every public method may be called from any thread; one
// mutex per device guards everything. Nothing here calls into Python.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>
#include <c10/util/flat_hash_map.h>
#include <openreg.h>

#include <array>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "memory/OpenRegGrowthWatch.h"
#include "memory/OpenRegMemoryHistory.h"

namespace openreg::allocator {

using Stats = c10::CachingDeviceAllocator::DeviceStats;

struct BlockPool;

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream;  // allocation stream (id on `device`)
  size_t size;           // bytes, a multiple of kMinBlockSize
  size_t requested = 0;  // bytes asked for while allocated
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  bool recent = false;    // freed, waiting unmerged in DeviceCache::recent_
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  int event_count = 0;  // outstanding events before the block is free
  size_t gc_base = 0;   // the pool's search count when the block was freed
  ska::flat_hash_set<c10::StreamId> stream_uses;  // other streams using it
  // Where it was allocated, while recording history (OpenRegMemoryHistory.h).
  std::shared_ptr<c10::GatheredContext> context;

  Block(c10::DeviceIndex d, c10::StreamId s, size_t sz, BlockPool* p, char* pt)
      : device(d), stream(s), size(sz), pool(p), ptr(pt) {}
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Free blocks ordered by stream, then size, then address: a lower bound on
// (stream, size) is the best fit on that stream.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const;
};

struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, BlockOrder> blocks;  // free blocks
  const bool is_small;
  // Searches of this pool while garbage collection is on: a free block's
  // age is the number of searches since it was freed.
  size_t searches = 0;
};

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {}
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  // What malloc does when the device is full.
  enum class WhenFull {
    kRaise,   // free the cache, retry, raise torch.OutOfMemoryError
    kDefer,   // the same, but return nullptr instead of raising (the caller
              // collects blocks held for other processes and retries)
    kGiveUp,  // return nullptr at once: no cache freed, nothing counted
  };
  // A block of at least `size` bytes for use on `stream`. `context`: the
  // caller's stack, while history is recorded (gather_context).
  Block* malloc(size_t size, c10::StreamId stream, WhenFull when_full,
                std::shared_ptr<c10::GatheredContext> context = nullptr);
  // What a request of `size` bytes on `stream` does when the device is full
  // (faults::fail_allocation): frees the cache, counts a retry and an OOM,
  // raises torch.OutOfMemoryError.
  [[noreturn]] void fail_as_full(size_t size, c10::StreamId stream);
  // Returns an allocated block (after the events of its other streams).
  void free(Block* block,
            std::shared_ptr<c10::GatheredContext> context = nullptr);
  void record_stream(Block* block, c10::StreamId stream);
  // Drains the device and gives every whole free segment back.
  void empty_cache();

  Stats stats();
  // What one more allocation may take: the bytes the device (or the
  // process's fraction of it) allows, minus those allocated (cached blocks
  // count as free: the cache gives them back when it must).
  size_t free_bytes();
  void reset_accumulated();
  void reset_peak();

  void set_fraction(double fraction);
  double fraction();

  // Every segment with its blocks, in c10's snapshot types. The `stream` of
  // a segment holds its c10::StreamId (what torch.Stream.stream_id shows):
  // openreg's runtime streams have no handle visible from Python.
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> snapshot();

  // The recorded history of this device, oldest first; and its reset.
  std::vector<TraceEntry> traces();
  void clear_traces();

  // The block of this cache holding address p: its start, its requested
  // size, and whether it is allocated. False if no segment holds p.
  bool find(const void* p, const char** begin, size_t* size, bool* allocated);

 private:
  void pool_insert(Block* b);
  void pool_erase(Block* b);
  Block* take_free_block(BlockPool& pool, c10::StreamId stream, size_t size);
  Block* new_segment(BlockPool& pool, c10::StreamId stream, size_t size,
                     size_t orig_size, WhenFull when_full,
                     const std::shared_ptr<c10::GatheredContext>& context);
  bool gc_enabled() const;
  void garbage_collect();
  bool release_oversize_blocks(BlockPool& pool, c10::StreamId stream,
                               size_t size);
  size_t reserved() const;
  size_t allowed();
  size_t capacity();
  orError_t try_malloc(size_t alloc_size, void** ptr);
  [[noreturn]] void raise_oom(size_t orig_size);
  Block* maybe_split(Block* block, size_t size);
  void insert_events(Block* block);
  void process_events();
  void synchronize_and_free_events();
  void free_block(Block* block);
  // Records that `block`'s free has completed (history).
  void free_completed(const Block* block);
  void merge_free(Block* block);
  void keep_recent(Block* block);
  Block* take_recent(c10::StreamId stream, size_t size);
  void flush_recent();
  void release_block(Block* block);
  void release_cached_blocks();

  const c10::DeviceIndex device_;
  std::mutex mutex_;  // guards everything below
  Stats stats_;
  GrowthWatch growth_;  // for the out-of-memory message
  BlockPool small_{true};
  BlockPool large_{false};
  std::set<Block*> segments_;  // first block of every segment
  std::deque<std::pair<orEvent_t, Block*>> events_;  // pending frees, in order
  static constexpr size_t kRecentBlocks = 16;
  std::array<Block*, kRecentBlocks> recent_{};  // oldest first
  size_t recent_count_ = 0;
  double fraction_ = 1.0;
  bool fraction_set_ = false;  // set_fraction was called (enables the GC)
  size_t capacity_ = 0;
  Trace trace_;
};

}  // namespace openreg::allocator
