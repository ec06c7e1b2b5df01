// The device caching allocator as PyTorch sees it: the c10::DeviceAllocator
// registered for PrivateUse1 (torch.empty(..., device="openreg"),
// torch.accelerator's memory functions, Tensor.record_stream).
//
// It finds the current device and stream, hands the request to that
// device's cache (OpenRegDeviceCache.h, policy in OpenRegAllocatorPolicy.h)
// and maps every live allocation's address back to its block for the
// deleter and recordStream.
//
// Thread-safety: every function may be called from any thread; the
// pointer-to-block map has its own mutex, each device cache its own.
#include <algorithm>
#include <array>
#include <iterator>
#include <memory>
#include <mutex>

#include "core/OpenRegEngine.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegDeviceCache.h"
#include "memory/OpenRegIpc.h"
#include "memory/OpenRegMemcpy.h"

namespace openreg {

namespace {

using allocator::Block;
using allocator::DeviceCache;
using allocator::Stats;

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

// [doc:allocator-allocate]
class OpenRegCachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    if (nbytes == 0) {
      return {nullptr, nullptr, &delete_block,
              c10::Device(c10::DeviceType::PrivateUse1, device)};
    }
    return allocate_on(nbytes, device, getCurrentStream(device).id());
  }

  // A block for use on stream `stream` of `device` (nbytes > 0). With
  // `may_fail`, an empty DataPtr when the device is full (nothing freed).
  c10::DataPtr allocate_on(size_t nbytes, c10::DeviceIndex device,
                           c10::StreamId stream, bool may_fail = false) {
    using WhenFull = DeviceCache::WhenFull;
    const c10::Device dev(c10::DeviceType::PrivateUse1, device);
    // The caller's stack while history is recorded, gathered before the
    // cache's lock is taken (it may take the GIL).
    auto context = allocator::gather_context(/*free=*/false);
    faults::check_not_poisoned(device);
    if (!may_fail && faults::allocation_fails(device, nbytes)) {
      cache(device).fail_as_full(nbytes, stream);  // faults::fail_allocation
    }
    Block* block =
        cache(device).malloc(nbytes, stream,
                             may_fail               ? WhenFull::kGiveUp
                             : ipc_blocks_pending() ? WhenFull::kDefer
                                                    : WhenFull::kRaise,
                             context);
    if (block == nullptr && !may_fail) {
      // Blocks shared with other processes wait for their receivers: free
      // those that are done and retry once, as CUDA's allocator does.
      ipc_collect();
      block = cache(device).malloc(nbytes, stream, WhenFull::kRaise,
                                   std::move(context));
    }
    if (block == nullptr) {
      return {nullptr, dev};
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
      if (engine().empty_cache != nullptr) {
        engine().empty_cache(d);  // the engine's workspace on the device
      }
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
    g_allocator.cache(block->device)
        .free(block, allocator::gather_context(/*free=*/true));
  } catch (const std::exception& e) {
    // Deleters must not throw.
    TORCH_WARN("openreg allocator: free failed: ", e.what());
  }
}
// [/doc:allocator-delete]

}  // namespace

c10::DeviceAllocator* device_allocator() { return &g_allocator; }

c10::DataPtr allocate_device_memory(size_t nbytes, c10::Stream stream) {
  TORCH_INTERNAL_ASSERT(nbytes > 0 &&
                        stream.device_type() == c10::DeviceType::PrivateUse1);
  return g_allocator.allocate_on(nbytes, stream.device_index(), stream.id());
}

void record_memory_history(const allocator::HistorySettings& settings,
                           bool clear) {
  allocator::set_history_settings(settings);
  if (clear && is_initialized()) {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      g_allocator.cache(d).clear_traces();
    }
  }
}

std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>>
memory_traces() {
  std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>> out;
  if (is_initialized()) {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      out.push_back(g_allocator.cache(d).traces());
    }
  }
  return out;
}

c10::DataPtr try_allocate_device_memory(size_t nbytes, c10::Stream stream) {
  TORCH_INTERNAL_ASSERT(nbytes > 0 &&
                        stream.device_type() == c10::DeviceType::PrivateUse1);
  return g_allocator.allocate_on(nbytes, stream.device_index(), stream.id(),
                                 /*may_fail=*/true);
}

std::optional<DeviceBlockExtent> find_device_block(const void* p,
                                                   c10::DeviceIndex device) {
  DeviceBlockExtent out{};
  if (!g_allocator.cache(device).find(p, &out.begin, &out.size,
                                      &out.allocated)) {
    return std::nullopt;
  }
  return out;
}

void set_memory_fraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0,
              "Invalid fraction value: ", fraction, ". Allowed range: 0~1");
  g_allocator.cache(device).set_fraction(fraction);
}

size_t device_free_bytes(c10::DeviceIndex device) {
  return g_allocator.cache(device).free_bytes();
}

double get_memory_fraction(c10::DeviceIndex device) {
  return g_allocator.cache(device).fraction();
}

std::vector<c10::CachingDeviceAllocator::SegmentInfo> memory_snapshot() {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> all;
  if (!is_initialized()) {
    return all;
  }
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    auto segments = g_allocator.cache(d).snapshot();
    std::move(segments.begin(), segments.end(), std::back_inserter(all));
  }
  return all;
}

// [doc:allocator-register]
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);
// [/doc:allocator-register]

}  // namespace openreg
