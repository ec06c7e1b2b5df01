// The device caching allocator.
//
// Tensors come and go far faster than a driver allocation should be made, so
// freed blocks are kept and handed out again; the runtime (orMalloc/orFree) is
// called only to grow or shrink the cache.
//
// Sizes (the same policy as CUDA's caching allocator, so memory statistics
// mean the same thing):
//  - every request is rounded up to a multiple of kMinBlockSize (512 bytes);
//  - requests up to kSmallSize (1 MiB) come from the small pool, whose
//    segments are kSmallBuffer (2 MiB);
//  - larger requests come from the large pool: up to kMinLargeAlloc (10 MiB)
//    they get a kLargeBuffer (20 MiB) segment, above that a segment of the
//    request rounded up to kRoundLarge (2 MiB);
//  - a cached block is split when the rest is worth keeping: at least
//    kMinBlockSize in the small pool, more than kSmallSize in the large one;
//  - a freed block merges with free neighbours of its segment.
//
// Streams: a block belongs to the stream it was allocated on and is reused on
// that stream at once (stream order makes that safe). If it was also used on
// other streams (Tensor.record_stream), freeing it records an event on each
// of them, and the block returns to the pool only once all have completed.
//
// Out of memory: the allocation frees all cached blocks, retries, and then
// raises torch.OutOfMemoryError with the numbers a CUDA user expects.
//
// Thread-safety: every public function may be called from any thread; each
// device has its own mutex, and the pointer-to-block map has its own. Nothing
// here calls into Python.
#include <c10/core/Stream.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegIpc.h"
#include "memory/OpenRegMemcpy.h"

namespace openreg {

namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatType;
using Stats = c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = size_t{1} << 20;
constexpr size_t kSmallBuffer = size_t{2} << 20;
constexpr size_t kLargeBuffer = size_t{20} << 20;
constexpr size_t kMinLargeAlloc = size_t{10} << 20;
constexpr size_t kRoundLarge = size_t{2} << 20;

size_t round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

size_t round_size(size_t size) {
  return size < kMinBlockSize ? kMinBlockSize : round_up(size, kMinBlockSize);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) {
    return kSmallBuffer;
  }
  if (size < kMinLargeAlloc) {
    return kLargeBuffer;
  }
  return round_up(size, kRoundLarge);
}

std::string format_size(size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (bytes >= (size_t{1} << 30)) {
    os << static_cast<double>(bytes) / (size_t{1} << 30) << " GiB";
  } else if (bytes >= (size_t{1} << 20)) {
    os << static_cast<double>(bytes) / (size_t{1} << 20) << " MiB";
  } else if (bytes >= (size_t{1} << 10)) {
    os << static_cast<double>(bytes) / (size_t{1} << 10) << " KiB";
  } else {
    os << bytes << " bytes";
  }
  return os.str();
}

struct BlockPool;

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream;  // allocation stream (id on `device`)
  size_t size;           // bytes, a multiple of kMinBlockSize
  size_t requested = 0;  // bytes asked for while allocated
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  int event_count = 0;  // outstanding events before the block is free
  ska::flat_hash_set<c10::StreamId> stream_uses;  // other streams using it

  Block(c10::DeviceIndex d, c10::StreamId s, size_t sz, BlockPool* p, char* pt)
      : device(d), stream(s), size(sz), pool(p), ptr(pt) {}
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) {
      return a->stream < b->stream;
    }
    if (a->size != b->size) {
      return a->size < b->size;
    }
    return a->ptr < b->ptr;
  }
};

struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, BlockOrder> blocks;  // free blocks
  const bool is_small;
};

// Where each live allocation's Block is found from its address.
class BlockMap {
 public:
  void insert(void* ptr, Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    map_.emplace(ptr, block);
  }
  Block* take(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(ptr);
    if (it == map_.end()) {
      return nullptr;
    }
    Block* b = it->second;
    map_.erase(it);
    return b;
  }
  Block* find(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(ptr);
    return it == map_.end() ? nullptr : it->second;
  }

 private:
  std::mutex mutex_;  // guards map_
  ska::flat_hash_map<void*, Block*> map_;
};

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {}

  // With `may_defer_oom`, returns nullptr instead of raising out of memory
  // (the caller collects blocks held for other processes and retries).
  Block* malloc(size_t orig_size, c10::StreamId stream, bool may_defer_oom) {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    const size_t size = round_size(orig_size);
    BlockPool& pool = size <= kSmallSize ? small_ : large_;
    Block* block = take_free_block(pool, stream, size);
    if (block == nullptr) {
      block = new_segment(pool, stream, size, orig_size, may_defer_oom);
      if (block == nullptr) {
        return nullptr;
      }
    }
    block = maybe_split(block, size);
    block->allocated = true;
    block->requested = orig_size;
    for_pools(pool, [&](size_t i) {
      stats_.allocation[i].increase(1);
      stats_.allocated_bytes[i].increase(block->size);
      stats_.active[i].increase(1);
      stats_.active_bytes[i].increase(block->size);
      stats_.requested_bytes[i].increase(orig_size);
    });
    return block;
  }

  void free(Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    block->allocated = false;
    for_pools(*block->pool, [&](size_t i) {
      stats_.allocation[i].decrease(1);
      stats_.allocated_bytes[i].decrease(block->size);
      stats_.requested_bytes[i].decrease(block->requested);
    });
    block->requested = 0;
    if (!block->stream_uses.empty()) {
      insert_events(block);
    } else {
      free_block(block);
    }
  }

  void record_stream(Block* block, c10::StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stream != block->stream) {
      block->stream_uses.insert(stream);
    }
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_blocks();
  }

  Stats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mutex_);
    for_all_stats([](Stat& s) { s.reset_accumulated(); });
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    for_all_stats([](Stat& s) { s.reset_peak(); });
  }

  void set_fraction(double fraction) {
    std::lock_guard<std::mutex> lock(mutex_);
    fraction_ = fraction;
  }

  double fraction() {
    std::lock_guard<std::mutex> lock(mutex_);
    return fraction_;
  }

  std::vector<SegmentSnapshot> snapshot() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SegmentSnapshot> out;
    for (Block* head : segments_) {
      SegmentSnapshot seg;
      seg.device = device_;
      seg.address = reinterpret_cast<uintptr_t>(head->ptr);
      seg.stream = head->stream;
      seg.is_small = head->pool->is_small;
      for (Block* b = head; b != nullptr; b = b->next) {
        seg.total_size += b->size;
        BlockSnapshot bs;
        bs.address = reinterpret_cast<uintptr_t>(b->ptr);
        bs.size = b->size;
        bs.requested_size = b->requested;
        bs.state = b->allocated         ? "active_allocated"
                   : b->event_count > 0 ? "active_pending_free"
                                        : "inactive";
        if (b->allocated) {
          seg.allocated_size += b->size;
          seg.requested_size += b->requested;
        }
        if (b->allocated || b->event_count > 0) {
          seg.active_size += b->size;
        }
        seg.blocks.push_back(std::move(bs));
      }
      out.push_back(std::move(seg));
    }
    return out;
  }

 private:
  template <typename F>
  static void for_pools(const BlockPool& pool, F&& f) {
    f(static_cast<size_t>(StatType::AGGREGATE));
    f(static_cast<size_t>(pool.is_small ? StatType::SMALL_POOL
                                        : StatType::LARGE_POOL));
  }

  template <typename F>
  void for_all_stats(F&& f) {
    for (auto* array :
         {&stats_.allocation, &stats_.segment, &stats_.active,
          &stats_.inactive_split, &stats_.allocated_bytes,
          &stats_.reserved_bytes, &stats_.active_bytes,
          &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      for (Stat& s : *array) {
        f(s);
      }
    }
    f(stats_.oversize_allocations);
    f(stats_.oversize_segments);
  }

  // Pool membership also decides the inactive_split statistics: a free
  // block that shares its segment with others is an inactive split.
  void pool_insert(Block* b) {
    b->pool->blocks.insert(b);
    if (b->is_split()) {
      for_pools(*b->pool, [&](size_t i) {
        stats_.inactive_split[i].increase(1);
        stats_.inactive_split_bytes[i].increase(b->size);
      });
    }
  }

  void pool_erase(Block* b) {
    b->pool->blocks.erase(b);
    if (b->is_split()) {
      for_pools(*b->pool, [&](size_t i) {
        stats_.inactive_split[i].decrease(1);
        stats_.inactive_split_bytes[i].decrease(b->size);
      });
    }
  }

  Block* take_free_block(BlockPool& pool, c10::StreamId stream, size_t size) {
    Block key(device_, stream, size, &pool, nullptr);
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) {
      return nullptr;
    }
    Block* b = *it;
    pool_erase(b);
    return b;
  }

  // [doc:allocator-new-segment]
  // Allocates a new segment from the runtime; on failure frees the cache and
  // retries once, then raises torch.OutOfMemoryError.
  Block* new_segment(BlockPool& pool, c10::StreamId stream, size_t size,
                     size_t orig_size, bool may_defer_oom) {
    const size_t alloc_size = pool.is_small ? kSmallBuffer : segment_size(size);
    void* ptr = nullptr;
    orError_t err = try_malloc(alloc_size, &ptr);
    if (err == orErrorMemoryAllocation) {
      release_cached_blocks();
      ++stats_.num_alloc_retries;
      err = try_malloc(alloc_size, &ptr);
    }
    if (err == orErrorMemoryAllocation && may_defer_oom) {
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
    segments_.insert(block);
    for_pools(pool, [&](size_t i) {
      stats_.segment[i].increase(1);
      stats_.reserved_bytes[i].increase(alloc_size);
    });
    return block;
  }
  // [/doc:allocator-new-segment]

  size_t reserved() const {
    return static_cast<size_t>(
        stats_.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)]
            .current);
  }

  size_t capacity() {
    if (capacity_ == 0) {
      ScopedDevice guard(device_);
      size_t free_bytes = 0;
      OPENREG_CHECK(orMemGetInfo(&free_bytes, &capacity_));
    }
    return capacity_;
  }

  orError_t try_malloc(size_t alloc_size, void** ptr) {
    const auto allowed =
        static_cast<size_t>(fraction_ * static_cast<double>(capacity()));
    if (reserved() + alloc_size > allowed) {
      return orErrorMemoryAllocation;
    }
    ScopedDevice guard(device_);
    return orMalloc(ptr, alloc_size);
  }

  [[noreturn]] void raise_oom(size_t orig_size) {
    ScopedDevice guard(device_);
    size_t free_bytes = 0;
    size_t total = 0;
    OPENREG_CHECK(orMemGetInfo(&free_bytes, &total));
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    const auto allocated =
        static_cast<size_t>(stats_.allocated_bytes[agg].current);
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
        " Set OPENREG_DEVICE_MEMORY to simulate a larger device.");
  }

  bool should_split(const Block* b, size_t size) const {
    const size_t rest = b->size - size;
    return b->pool->is_small ? rest >= kMinBlockSize : rest > kSmallSize;
  }

  Block* maybe_split(Block* block, size_t size) {
    if (!should_split(block, size)) {
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

  void insert_events(Block* block) {
    ScopedDevice guard(device_);
    for (c10::StreamId id : block->stream_uses) {
      orEvent_t event = nullptr;
      OPENREG_CHECK(orEventCreateWithFlags(&event, orEventDisableTiming));
      const c10::Stream stream(
          c10::Stream::UNSAFE,
          c10::Device(c10::DeviceType::PrivateUse1, device_), id);
      OPENREG_CHECK(orEventRecord(event, native_stream(stream)));
      ++block->event_count;
      events_.emplace_back(event, block);
    }
    block->stream_uses.clear();
  }

  // Returns blocks whose streams have passed their last use, in order.
  void process_events() {
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
        free_block(block);
      }
    }
  }

  void synchronize_and_free_events() {
    while (!events_.empty()) {
      auto [event, block] = events_.front();
      events_.pop_front();
      synchronize_event(event);
      OPENREG_CHECK(orEventDestroy(event));
      if (--block->event_count == 0) {
        free_block(block);
      }
    }
  }

  static bool can_merge(const Block* b) {
    return b != nullptr && !b->allocated && b->event_count == 0 &&
           b->stream_uses.empty();
  }

  // A block no longer in use returns to its pool, merged with free
  // neighbours.
  void free_block(Block* block) {
    for_pools(*block->pool, [&](size_t i) {
      stats_.active[i].decrease(1);
      stats_.active_bytes[i].decrease(block->size);
    });
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

  // Gives every whole free segment back to the runtime. Kernels still queued
  // may use a cached block (a block freed on the host is reused in stream
  // order), so the device is drained first, as cudaFree does.
  void release_cached_blocks() {
    synchronize_device(device_);  // raises a pending kernel error, if any
    synchronize_and_free_events();
    for (BlockPool* pool : {&small_, &large_}) {
      for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
        Block* b = *it;
        ++it;
        if (b->is_split()) {
          continue;
        }
        pool_erase(b);
        segments_.erase(b);
        OPENREG_CHECK(orFree(b->ptr));
        ++stats_.num_device_free;
        for_pools(*pool, [&](size_t i) {
          stats_.segment[i].decrease(1);
          stats_.reserved_bytes[i].decrease(b->size);
        });
        delete b;
      }
    }
  }

  const c10::DeviceIndex device_;
  std::mutex mutex_;  // guards everything below
  Stats stats_;
  BlockPool small_{true};
  BlockPool large_{false};
  std::set<Block*> segments_;  // first block of every segment
  std::deque<std::pair<orEvent_t, Block*>> events_;  // pending frees, in order
  double fraction_ = 1.0;
  size_t capacity_ = 0;
};

// [doc:allocator-allocate]
class OpenRegCachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    const c10::Device dev(c10::DeviceType::PrivateUse1, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &delete_block, dev};
    }
    const c10::StreamId stream = getCurrentStream(device).id();
    Block* block = cache(device).malloc(nbytes, stream, ipc_blocks_pending());
    if (block == nullptr) {
      // Blocks shared with other processes wait for their receivers: free
      // those that are done and retry once, as CUDA's allocator does.
      ipc_collect();
      block = cache(device).malloc(nbytes, stream, false);
    }
    blocks_.insert(block->ptr, block);
    return {block->ptr, block->ptr, &delete_block, dev};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

  // Stream-ordered on the current stream of the destination's device.
  void copy_data(void* dest, const void* src, size_t count) const override {
    if (count == 0) {
      return;
    }
    memcpy_on_stream(dest, src, count, orMemcpyDeviceToDevice,
                     getCurrentStream(device_of_pointer(dest)));
  }

  bool initialized() override { return is_initialized(); }
  // [/doc:allocator-allocate]

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    if (!is_initialized()) {
      return;
    }
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      cache(d).empty_cache();
    }
  }

  // [doc:allocator-record-stream]
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get() == nullptr) {
      return;
    }
    // Storages shared with other processes (OpenRegIpc.h).
    if (const c10::DataPtr* original = ipc_original_data_ptr(ptr)) {
      recordStream(*original, stream);
      return;
    }
    if (ipc_record_received_stream(ptr, stream)) {
      return;
    }
    TORCH_CHECK(ptr.get_deleter() == &delete_block,
                "recordStream: the pointer was not allocated by openreg's "
                "device allocator");
    TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
                "recordStream expects an openreg stream, got one on ",
                stream.device());
    Block* block = blocks_.find(ptr.get_context());
    TORCH_CHECK(block != nullptr, "recordStream: unknown pointer ",
                ptr.get_context());
    TORCH_CHECK(stream.device_index() == block->device,
                "recordStream: the tensor is on openreg:",
                static_cast<int>(block->device), " but the stream is on ",
                stream.device());
    cache(block->device).record_stream(block, stream.id());
  }
  // [/doc:allocator-record-stream]

  Stats getDeviceStats(c10::DeviceIndex device) override {
    return cache(device).stats();
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    cache(device).reset_accumulated();
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    cache(device).reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    ScopedDevice guard(device);
    size_t free_bytes = 0;
    size_t total = 0;
    OPENREG_CHECK(orMemGetInfo(&free_bytes, &total));
    return {free_bytes, total};
  }

  DeviceCache& cache(c10::DeviceIndex device) {
    check_device_index(device);
    auto i = static_cast<size_t>(device);
    std::call_once(once_[i], [this, i, device] {
      caches_[i] = std::make_unique<DeviceCache>(device);
    });
    return *caches_[i];
  }

 private:
  static void delete_block(void* ptr);

  BlockMap blocks_;
  std::array<std::once_flag, kMaxDevices> once_;
  std::array<std::unique_ptr<DeviceCache>, kMaxDevices> caches_;
};

OpenRegCachingAllocator g_allocator;

// [doc:allocator-delete]
void OpenRegCachingAllocator::delete_block(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  if (is_in_bad_fork()) {
    return;  // the child must not touch the parent's device state
  }
  Block* block = g_allocator.blocks_.take(ptr);
  if (block == nullptr) {
    TORCH_WARN("openreg allocator: freeing unknown pointer ", ptr);
    return;
  }
  try {
    g_allocator.cache(block->device).free(block);
  } catch (const std::exception& e) {
    // Deleters must not throw.
    TORCH_WARN("openreg allocator: free failed: ", e.what());
  }
}
// [/doc:allocator-delete]

}  // namespace

c10::DeviceAllocator* device_allocator() { return &g_allocator; }

void set_memory_fraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0,
              "Invalid fraction value: ", fraction, ". Allowed range: 0~1");
  g_allocator.cache(device).set_fraction(fraction);
}

double get_memory_fraction(c10::DeviceIndex device) {
  return g_allocator.cache(device).fraction();
}

std::vector<SegmentSnapshot> memory_snapshot() {
  std::vector<SegmentSnapshot> all;
  if (!is_initialized()) {
    return all;
  }
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    auto segs = g_allocator.cache(d).snapshot();
    all.insert(all.end(), segs.begin(), segs.end());
  }
  return all;
}

// [doc:allocator-register]
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);
// [/doc:allocator-register]

}  // namespace openreg
