// Device memory: a first-fit-by-size (best fit) sub-allocator over each
// device's arena, pointer attributes, memcpy and memset.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bulk_copy.h"
#include "runtime_internal.h"

namespace openreg_rt {

namespace {

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Returns to the system the physical pages that the freed block
// [block_begin, block_end) touched, as far as they lie wholly inside the free
// range [begin, end) it was merged into. Pages of the neighbours were
// released when those were freed, so only the block's own pages are punched.
void release_pages(Device& dev, size_t begin, size_t end, size_t block_begin,
                   size_t block_end) {
  size_t page = page_size();
  size_t first = std::max(round_up(begin, page), block_begin / page * page);
  size_t last = std::min(end / page * page, round_up(block_end, page));
  if (last <= first) {
    return;
  }
  if (fallocate(dev.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(first),
                static_cast<off_t>(last - first)) != 0) {
    // Not fatal: the memory stays resident but remains correct.
    std::perror("openreg: fallocate(PUNCH_HOLE)");
  }
}

// Finds the live block containing p. Caller holds dev.mem_mutex.
bool find_live(Device& dev, const void* p, size_t* base, size_t* size) {
  size_t off =
      static_cast<size_t>(static_cast<const char*>(p) - dev.device_base);
  auto it = dev.live.upper_bound(off);
  if (it == dev.live.begin()) {
    return false;
  }
  --it;
  if (off >= it->first + it->second) {
    return false;
  }
  *base = it->first;
  *size = it->second;
  return true;
}

}  // namespace

bool range_is_live(Device& dev, const void* p, size_t n) {
  std::lock_guard<std::mutex> lock(dev.mem_mutex);
  size_t base = 0;
  size_t size = 0;
  if (!find_live(dev, p, &base, &size)) {
    return false;
  }
  size_t off =
      static_cast<size_t>(static_cast<const char*>(p) - dev.device_base);
  // off lies in [base, base + size), so the subtraction cannot wrap; the
  // obvious `off + n <= base + size` overflows for huge n.
  return n <= base + size - off;
}

void* kernel_ptr(Device& dev, const void* p) {
  return dev.kernel_base + (static_cast<const char*>(p) - dev.device_base);
}

bool range_is_valid(const DeviceRange& range, const void* p, size_t n) {
  if (!range.imported) {
    return range_is_live(*range.dev, p, n);
  }
  // An imported allocation is live as a whole while it is open.
  const size_t off =
      static_cast<size_t>(static_cast<const char*>(p) - range.device_base);
  return off < range.size && n <= range.size - off;
}

void* kernel_ptr(const DeviceRange& range, const void* p) {
  return range.kernel_base + (static_cast<const char*>(p) - range.device_base);
}

}  // namespace openreg_rt

using namespace openreg_rt;

namespace {

enum class Where { kHost, kDevice, kBadDevice };

struct Side {
  Where where;
  DeviceRange range;  // range.dev == nullptr for host memory
};

Side classify(const void* p, size_t n) {
  Side side{Where::kHost, {}};
  if (find_device_range(p, &side.range)) {
    side.where =
        range_is_valid(side.range, p, n) ? Where::kDevice : Where::kBadDevice;
  }
  return side;
}

// Validates a copy. On success, *dst_range / *src_range say where the sides
// live (dev == nullptr for host sides).
orError_t check_copy(void* dst, const void* src, size_t count,
                     orMemcpyKind kind, DeviceRange* dst_range,
                     DeviceRange* src_range) {
  if (dst == nullptr || src == nullptr) {
    return count == 0 ? orSuccess : orErrorInvalidValue;
  }
  if (kind < orMemcpyHostToHost || kind > orMemcpyDefault) {
    return orErrorInvalidMemcpyDirection;
  }
  Side d = classify(dst, count);
  Side s = classify(src, count);
  if (d.where == Where::kBadDevice || s.where == Where::kBadDevice) {
    return orErrorInvalidDevicePointer;
  }
  bool dst_is_dev = d.where == Where::kDevice;
  bool src_is_dev = s.where == Where::kDevice;
  if (kind != orMemcpyDefault) {
    bool want_dst =
        kind == orMemcpyHostToDevice || kind == orMemcpyDeviceToDevice;
    bool want_src =
        kind == orMemcpyDeviceToHost || kind == orMemcpyDeviceToDevice;
    if (want_dst != dst_is_dev || want_src != src_is_dev) {
      return orErrorInvalidMemcpyDirection;
    }
  }
  *dst_range = d.range;
  *src_range = s.range;
  return orSuccess;
}

// The device's copy engine (bulk_copy.cpp) does the copy, as a device
// process's does: the two drivers copy alike.
void do_copy(void* dst, const void* src, size_t count,
             const DeviceRange& dst_range, const DeviceRange& src_range) {
  auto* d =
      static_cast<char*>(dst_range.dev ? kernel_ptr(dst_range, dst) : dst);
  const auto* s = static_cast<const char*>(
      src_range.dev ? kernel_ptr(src_range, src) : src);
  openreg_device::copy_bytes(d, s, count);
}

}  // namespace

extern "C" {

orError_t orMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) {
    return orErrorInvalidValue;
  }
  *ptr = nullptr;
  OR_RETURN_IF_ERROR(ensure_init());
  if (size == 0) {
    return orSuccess;
  }
  Device* dev = device_at(current_device());
  OR_RETURN_IF_ERROR(check_not_lost(dev));
  if (size > dev->capacity) {
    return orErrorMemoryAllocation;
  }
  size_t need = round_up(size, kAllocAlignment);
  std::lock_guard<std::mutex> lock(dev->mem_mutex);
  // Best fit: the smallest free range that holds the request.
  auto best = dev->free_ranges.end();
  for (auto it = dev->free_ranges.begin(); it != dev->free_ranges.end(); ++it) {
    if (it->second >= need &&
        (best == dev->free_ranges.end() || it->second < best->second)) {
      best = it;
      if (it->second == need) {
        break;
      }
    }
  }
  if (best == dev->free_ranges.end()) {
    return orErrorMemoryAllocation;
  }
  size_t offset = best->first;
  size_t rest = best->second - need;
  dev->free_ranges.erase(best);
  if (rest != 0) {
    dev->free_ranges.emplace(offset + need, rest);
  }
  dev->live.emplace(offset, need);
  dev->used += need;
  *ptr = dev->device_base + offset;
  return orSuccess;
}

orError_t orFree(void* ptr) {
  if (ptr == nullptr) {
    return orSuccess;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_of(ptr);
  if (dev == nullptr) {
    return orErrorInvalidDevicePointer;
  }
  size_t offset =
      static_cast<size_t>(static_cast<char*>(ptr) - dev->device_base);
  std::lock_guard<std::mutex> lock(dev->mem_mutex);
  auto it = dev->live.find(offset);
  if (it == dev->live.end()) {
    return orErrorInvalidDevicePointer;
  }
  forget_export(*dev, offset);
  size_t begin = offset;
  size_t end = offset + it->second;
  const size_t block_begin = begin;
  const size_t block_end = end;
  dev->used -= it->second;
  dev->live.erase(it);
  // Merge with the free neighbours.
  auto next = dev->free_ranges.lower_bound(begin);
  if (next != dev->free_ranges.end() && next->first == end) {
    end += next->second;
    next = dev->free_ranges.erase(next);
  }
  if (next != dev->free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      dev->free_ranges.erase(prev);
    }
  }
  dev->free_ranges.emplace(begin, end - begin);
  release_pages(*dev, begin, end, block_begin, block_end);
  return orSuccess;
}

orError_t orPointerGetAttributes(orPointerAttributes* attributes,
                                 const void* ptr) {
  if (attributes == nullptr) {
    return orErrorInvalidValue;
  }
  std::memset(attributes, 0, sizeof(*attributes));
  attributes->device = -1;
  OR_RETURN_IF_ERROR(ensure_init());
  if (ptr == nullptr) {
    return orSuccess;
  }
  if (Device* dev = device_of(ptr)) {
    size_t base = 0;
    size_t size = 0;
    std::lock_guard<std::mutex> lock(dev->mem_mutex);
    if (!find_live(*dev, ptr, &base, &size)) {
      return orErrorInvalidDevicePointer;
    }
    attributes->type = orMemoryTypeDevice;
    attributes->device = dev->index;
    attributes->base = dev->device_base + base;
    attributes->size = size;
    return orSuccess;
  }
  DeviceRange imported;
  if (find_imported(ptr, &imported)) {
    attributes->type = orMemoryTypeDevice;
    attributes->device = imported.dev->index;
    attributes->base = imported.device_base;
    attributes->size = imported.size;
    return orSuccess;
  }
  return host_attributes(attributes, ptr);
}

orError_t orMemcpy(void* dst, const void* src, size_t count,
                   orMemcpyKind kind) {
  OR_RETURN_IF_ERROR(ensure_init());
  DeviceRange dst_range;
  DeviceRange src_range;
  OR_RETURN_IF_ERROR(check_copy(dst, src, count, kind, &dst_range, &src_range));
  OR_RETURN_IF_ERROR(check_not_lost(dst_range.dev));
  OR_RETURN_IF_ERROR(check_not_lost(src_range.dev));
  if (count == 0) {
    return orSuccess;
  }
  // Ordered after the work queued on the default streams involved.
  if (dst_range.dev != nullptr) {
    OR_RETURN_IF_ERROR(dst_range.dev->default_stream->synchronize());
  }
  if (src_range.dev != nullptr && src_range.dev != dst_range.dev) {
    OR_RETURN_IF_ERROR(src_range.dev->default_stream->synchronize());
  }
  if (process_driver()) {
    Device* runner = dst_range.dev != nullptr ? dst_range.dev : src_range.dev;
    if (runner == nullptr) {
      std::memmove(dst, src, count);
      return orSuccess;
    }
    return proc::copy(runner->default_stream, dst, src, count,
                      dst_range.dev != nullptr, src_range.dev != nullptr, true);
  }
  do_copy(dst, src, count, dst_range, src_range);
  return orSuccess;
}

orError_t orMemcpyAsync(void* dst, const void* src, size_t count,
                        orMemcpyKind kind, orStream_t stream) {
  OR_RETURN_IF_ERROR(ensure_init());
  DeviceRange dst_range;
  DeviceRange src_range;
  OR_RETURN_IF_ERROR(check_copy(dst, src, count, kind, &dst_range, &src_range));
  if (stream == nullptr) {
    stream = device_at(current_device())->default_stream;
  }
  OR_RETURN_IF_ERROR(check_not_lost(dst_range.dev));
  OR_RETURN_IF_ERROR(check_not_lost(src_range.dev));
  OR_RETURN_IF_ERROR(check_not_lost(stream->device()));
  if (count == 0) {
    return orSuccess;
  }
  bool pageable =
      (dst_range.dev == nullptr && !host_range_is_pinned(dst, count)) ||
      (src_range.dev == nullptr && !host_range_is_pinned(src, count));
  if (pageable && dst_range.dev != nullptr && src_range.dev == nullptr &&
      count <= OR_MAX_INLINE_COPY_BYTES) {
    // [doc:inline-copy]
    // A small copy from pageable memory to the device travels in the
    // command itself, as a GPU driver writes a small copy's bytes into its
    // command buffer: the call returns once the bytes are captured, without
    // waiting for the stream's earlier work.
    if (process_driver()) {
      return proc::copy_inline(stream, dst, src, count);
    }
    if (stream->idle()) {
      // Nothing queued to order it after: the host thread copies at once
      // rather than waking the stream's worker for it.
      do_copy(dst, src, count, dst_range, src_range);
      return orSuccess;
    }
    std::vector<char> bytes(static_cast<const char*>(src),
                            static_cast<const char*>(src) + count);
    return stream->enqueue([=, bytes = std::move(bytes)] {
      do_copy(dst, bytes.data(), count, dst_range, DeviceRange{});
    });
    // [/doc:inline-copy]
  }
  if (process_driver()) {
    if (pageable) {
      OR_RETURN_IF_ERROR(stream->synchronize());
    }
    return proc::copy(stream, dst, src, count, dst_range.dev != nullptr,
                      src_range.dev != nullptr, pageable);
  }
  if (pageable) {
    // CUDA semantics: a copy to or from pageable memory is synchronous.
    OR_RETURN_IF_ERROR(stream->synchronize());
    do_copy(dst, src, count, dst_range, src_range);
    return orSuccess;
  }
  return stream->enqueue(
      [=] { do_copy(dst, src, count, dst_range, src_range); });
}

orError_t orMemset(void* dst, int value, size_t count) {
  OR_RETURN_IF_ERROR(ensure_init());
  if (dst == nullptr) {
    return count == 0 ? orSuccess : orErrorInvalidValue;
  }
  DeviceRange range;
  if (!find_device_range(dst, &range) || !range_is_valid(range, dst, count)) {
    return orErrorInvalidDevicePointer;
  }
  OR_RETURN_IF_ERROR(check_not_lost(range.dev));
  OR_RETURN_IF_ERROR(range.dev->default_stream->synchronize());
  if (process_driver()) {
    return proc::memset(range.dev->default_stream, dst, value, count);
  }
  std::memset(kernel_ptr(range, dst), value, count);
  return orSuccess;
}

orError_t orGetKernelPointer(void** kernel_ptr_out, const void* device_ptr) {
  if (kernel_ptr_out == nullptr) {
    return orErrorInvalidValue;
  }
  *kernel_ptr_out = nullptr;
  OR_RETURN_IF_ERROR(ensure_init());
  if (process_driver()) {
    // The memory lives in the device processes: nothing in this process
    // may read or write it.
    return orErrorNotSupported;
  }
  if (Device* dev = device_of(device_ptr)) {
    *kernel_ptr_out = kernel_ptr(*dev, device_ptr);
    return orSuccess;
  }
  DeviceRange imported;
  if (!find_imported(device_ptr, &imported)) {
    return orErrorInvalidDevicePointer;
  }
  *kernel_ptr_out = kernel_ptr(imported, device_ptr);
  return orSuccess;
}

// [doc:dma-pointer]
orError_t orMemGetDmaPointer(void** dma_ptr, const void* device_ptr,
                             size_t size) {
  if (dma_ptr == nullptr) {
    return orErrorInvalidValue;
  }
  *dma_ptr = nullptr;
  OR_RETURN_IF_ERROR(ensure_init());
  DeviceRange range;
  if (!find_device_range(device_ptr, &range) ||
      !range_is_valid(range, device_ptr, size)) {
    return orErrorInvalidDevicePointer;
  }
  OR_RETURN_IF_ERROR(check_not_lost(range.dev));
  if (!nic_dma()) {
    return orErrorNotSupported;
  }
  if (!process_driver()) {
    // The kernel view is already this process's.
    *dma_ptr = kernel_ptr(range, device_ptr);
    return orSuccess;
  }
  if (range.imported) {
    // Mapped when the handle was opened (ipc.cpp, map_views).
    if (range.dma_base == nullptr) {
      return orErrorNotSupported;
    }
    *dma_ptr = range.dma_base +
               (static_cast<const char*>(device_ptr) - range.device_base);
    return orSuccess;
  }
  Device& dev = *range.dev;
  char* base = dev.dma_base.load(std::memory_order_acquire);
  if (base == nullptr) {
    std::lock_guard<std::mutex> lock(dev.mem_mutex);
    base = dev.dma_base.load(std::memory_order_relaxed);
    if (base == nullptr) {
      // A second mapping of the arena's file, at addresses no device
      // pointer uses: host code that dereferences a device pointer still
      // faults. Only pages the library touches become resident here, and
      // orFree's hole punching reaches this mapping too.
      void* view = mmap(nullptr, dev.capacity, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_NORESERVE, dev.fd, 0);
      if (view == MAP_FAILED) {
        return orErrorMemoryAllocation;
      }
      base = static_cast<char*>(view);
      dev.dma_base.store(base, std::memory_order_release);
    }
  }
  *dma_ptr = base + (static_cast<const char*>(device_ptr) - dev.device_base);
  return orSuccess;
}
// [/doc:dma-pointer]

}  // extern "C"
