// The device allocator: one runtime allocation per tensor storage, with the
// statistics torch.accelerator and torch.openreg report.
//
// This allocator does not cache: every free returns the block to the runtime
// at once (so empty_cache has nothing to release). Freeing at once is safe
// because, in this version, every kernel and copy that uses a block has
// finished before the launching call returns; recordStream therefore has no
// pending use to wait for. The caching, stream-aware allocator replaces this
// file when execution becomes asynchronous.
#include "memory/OpenRegAllocator.h"

#include <array>
#include <cstring>
#include <mutex>
#include <sstream>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"

namespace openreg {

namespace {

constexpr size_t kSmallSize = size_t{1} << 20;  // CUDA's small-pool limit
constexpr int kMaxDevices = 16;
constexpr size_t kRuntimeAlignment = 512;  // orMalloc's allocation unit

// What a DataPtr's context holds: enough to free and account the block.
struct Block {
  void* ptr;
  size_t size;
  c10::DeviceIndex device;
};

std::string format_size(size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (bytes >= (size_t{1} << 30)) {
    os << static_cast<double>(bytes) / (1 << 30) << " GiB";
  } else if (bytes >= (size_t{1} << 20)) {
    os << static_cast<double>(bytes) / (1 << 20) << " MiB";
  } else {
    os << bytes << " bytes";
  }
  return os.str();
}

class OpenRegDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    void* ptr = nullptr;
    if (nbytes != 0) {
      orError_t err = orMalloc(&ptr, nbytes);
      if (err == orErrorMemoryAllocation) {
        record_oom(device);
        size_t free_bytes = 0;
        size_t total = 0;
        OPENREG_CHECK(orMemGetInfo(&free_bytes, &total));
        TORCH_CHECK_WITH(
            OutOfMemoryError, false,
            "openreg out of memory. Tried to allocate ", format_size(nbytes),
            ". Device ", static_cast<int>(device), " has a total capacity of ",
            format_size(total), " of which ", format_size(free_bytes),
            " is free. Of the allocated memory ",
            format_size(stats_snapshot(device).allocated_bytes[0].current),
            " is allocated by PyTorch. Set OPENREG_DEVICE_MEMORY to simulate "
            "a larger device.");
      }
      OPENREG_CHECK(err);
    }
    auto* block = new Block{ptr, nbytes, device};
    account(*block, true);
    return {ptr, block, &free_block,
            c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    OPENREG_CHECK(orMemcpy(dest, src, count, orMemcpyDeviceToDevice));
  }

  bool initialized() override { return is_initialized(); }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    // Nothing is cached: freed blocks went back to the runtime already.
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    TORCH_CHECK(ptr.get_deleter() == &free_block || ptr.get() == nullptr,
                "recordStream: the pointer was not allocated by openreg's "
                "device allocator");
    TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
                "recordStream expects an openreg stream, got ",
                stream.device());
    // No pending use can outlive the launching call (see the file comment).
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override {
    return stats_snapshot(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device_index(device);
    PerDevice& d = per_device_[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(d.mutex);
    for (auto* array : all_arrays(d.stats)) {
      for (auto& stat : *array) {
        stat.reset_accumulated();
      }
    }
    d.stats.num_ooms = 0;
    d.stats.num_alloc_retries = 0;
    d.stats.num_device_alloc = 0;
    d.stats.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    PerDevice& d = per_device_[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(d.mutex);
    for (auto* array : all_arrays(d.stats)) {
      for (auto& stat : *array) {
        stat.reset_peak();
      }
    }
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    ScopedDevice guard(device);
    size_t free_bytes = 0;
    size_t total = 0;
    OPENREG_CHECK(orMemGetInfo(&free_bytes, &total));
    return {free_bytes, total};
  }

 private:
  using Stats = c10::CachingDeviceAllocator::DeviceStats;

  struct PerDevice {
    std::mutex mutex;  // guards stats
    Stats stats;
  };

  static std::array<c10::CachingAllocator::StatArray*, 7> all_arrays(Stats& s) {
    return {&s.allocation,     &s.segment,         &s.active,
            &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
            &s.active_bytes};
  }

  static OpenRegDeviceAllocator& self();

  Stats stats_snapshot(c10::DeviceIndex device) {
    check_device_index(device);
    PerDevice& d = per_device_[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(d.mutex);
    return d.stats;
  }

  void record_oom(c10::DeviceIndex device) {
    PerDevice& d = per_device_[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(d.mutex);
    ++d.stats.num_ooms;
  }

  // Without caching, every block is its own segment and is active while
  // allocated, so allocated == reserved == active.
  void account(const Block& b, bool alloc) {
    if (b.size == 0) {
      return;
    }
    PerDevice& d = per_device_[static_cast<size_t>(b.device)];
    auto pool = static_cast<size_t>(
        b.size <= kSmallSize ? c10::CachingAllocator::StatType::SMALL_POOL
                             : c10::CachingAllocator::StatType::LARGE_POOL);
    const size_t rounded = (b.size + kRuntimeAlignment - 1) /
                           kRuntimeAlignment * kRuntimeAlignment;
    std::lock_guard<std::mutex> lock(d.mutex);
    Stats& s = d.stats;
    for (size_t i : {size_t{0}, pool}) {
      for (auto* counts : {&s.allocation[i], &s.segment[i], &s.active[i]}) {
        alloc ? counts->increase(1) : counts->decrease(1);
      }
      // The runtime hands out whole 512-byte units, as CUDA's allocator
      // does: *_bytes count those; requested_bytes counts what was asked.
      for (auto* bytes :
           {&s.allocated_bytes[i], &s.reserved_bytes[i], &s.active_bytes[i]}) {
        alloc ? bytes->increase(rounded) : bytes->decrease(rounded);
      }
      alloc ? s.requested_bytes[i].increase(b.size)
            : s.requested_bytes[i].decrease(b.size);
    }
    alloc ? ++s.num_device_alloc : ++s.num_device_free;
  }

  static void free_block(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    if (block->ptr != nullptr) {
      OPENREG_CHECK_WARN(orFree(block->ptr));
    }
    self().account(*block, false);
    delete block;
  }

  std::array<PerDevice, kMaxDevices> per_device_;
};

OpenRegDeviceAllocator g_device_allocator;

OpenRegDeviceAllocator& OpenRegDeviceAllocator::self() {
  return g_device_allocator;
}

// ---------------------------------------------------------------------------
// Pinned host memory.

class OpenRegHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    lazy_init();
    void* ptr = nullptr;
    if (nbytes != 0) {
      OPENREG_CHECK(orMallocHost(&ptr, nbytes));
    }
    return {ptr, ptr, &free_host, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_host; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  static void free_host(void* ptr) {
    if (ptr != nullptr) {
      OPENREG_CHECK_WARN(orFreeHost(ptr));
    }
  }
};

OpenRegHostAllocator g_host_allocator;

}  // namespace

c10::DeviceAllocator* device_allocator() { return &g_device_allocator; }

c10::Allocator* host_allocator() { return &g_host_allocator; }

bool is_pinned_ptr(const void* p) {
  if (!is_initialized() || is_in_bad_fork()) {
    return false;  // nothing can be pinned before the runtime starts
  }
  orPointerAttributes attr;
  orError_t err = orPointerGetAttributes(&attr, p);
  if (err == orErrorInvalidDevicePointer) {
    return false;  // a stale device address is not pinned host memory
  }
  OPENREG_CHECK(err);
  return attr.type == orMemoryTypeHost;
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

}  // namespace openreg
