// Pinned ("page-locked") host memory. The simulator does not lock pages (that
// needs privileges); it registers the allocations so that copies know they
// may run asynchronously and pointer queries can tell pinned from pageable.
#include <sys/mman.h>

#include <cstring>

#include "runtime_internal.h"

namespace openreg_rt {

namespace {

struct HostRegistry {
  std::mutex mutex;                    // guards `blocks`
  std::map<uintptr_t, size_t> blocks;  // base address -> size
};

HostRegistry& registry() {
  static auto* r = new HostRegistry();  // leaked: used until exit
  return *r;
}

// Caller holds the registry mutex.
bool find_block(HostRegistry& r, const void* p, uintptr_t* base, size_t* size) {
  auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = r.blocks.upper_bound(addr);
  if (it == r.blocks.begin()) {
    return false;
  }
  --it;
  if (addr >= it->first + it->second) {
    return false;
  }
  *base = it->first;
  *size = it->second;
  return true;
}

}  // namespace

bool host_range_is_pinned(const void* p, size_t n) {
  HostRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  uintptr_t base = 0;
  size_t size = 0;
  if (!find_block(r, p, &base, &size)) {
    return false;
  }
  // p lies in [base, base + size): compare without overflowing for huge n.
  return n <= base + size - reinterpret_cast<uintptr_t>(p);
}

orError_t host_attributes(orPointerAttributes* attributes, const void* p) {
  HostRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  uintptr_t base = 0;
  size_t size = 0;
  if (find_block(r, p, &base, &size)) {
    attributes->type = orMemoryTypeHost;
    attributes->base = reinterpret_cast<void*>(base);
    attributes->size = size;
  } else {
    attributes->type = orMemoryTypeUnregistered;
  }
  attributes->device = -1;
  return orSuccess;
}

}  // namespace openreg_rt

using namespace openreg_rt;

extern "C" {

orError_t orMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) {
    return orErrorInvalidValue;
  }
  *ptr = nullptr;
  OR_RETURN_IF_ERROR(ensure_init());
  if (size == 0) {
    return orSuccess;
  }
  void* p = nullptr;
  if (process_driver()) {
    // Shared with the device processes, which copy from and to it directly.
    OR_RETURN_IF_ERROR(proc::pinned_alloc(size, &p));
  } else {
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
    if (p == MAP_FAILED) {
      return orErrorMemoryAllocation;
    }
  }
  HostRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.blocks.emplace(reinterpret_cast<uintptr_t>(p), size);
  *ptr = p;
  return orSuccess;
}

orError_t orFreeHost(void* ptr) {
  if (ptr == nullptr) {
    return orSuccess;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  size_t size = 0;
  {
    HostRegistry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.blocks.end()) {
      return orErrorInvalidHostPointer;
    }
    size = it->second;
    r.blocks.erase(it);
  }
  if (process_driver()) {
    proc::pinned_free(ptr);
  } else {
    munmap(ptr, size);
  }
  return orSuccess;
}

}  // extern "C"
