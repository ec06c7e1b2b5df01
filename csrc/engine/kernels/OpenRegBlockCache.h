// SIMULATOR ONLY: a cache of host memory blocks by size, for the temporaries
// of the CPU kernels that run as device kernels (a device's workspace).
//
// A CPU kernel allocates its temporaries with the CPU allocator; the C
// library hands large blocks out with mmap and takes them back with munmap,
// so every call of such a kernel page-faults them in again (a 64-channel
// 56x56 convolution spent 0.8 of its 2 ms in page faults). A real device
// takes workspace from its caching allocator and reuses it from call to
// call; the simulator keeps the blocks its kernels freed, by size, up to
// kMaxCachedBytes beyond the blocks in use.
//
// Used, through FrontAllocator below, by the kernel library's workspace
// (engine/kernels/OpenRegWorkspace.cpp) and by the host's cache for the kernels
// it runs from closures (engine/memory/OpenRegKernelScratch.cpp). Thread-safe:
// a block may be freed on any thread.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>
#include <pthread.h>

#include <cstddef>
#include <cstring>
#include <mutex>
#include <vector>

namespace openreg {

class BlockCache {
 public:
  // Smaller temporaries are cheap for the C library (no mmap).
  static constexpr size_t kMinBytes = size_t{64} << 10;
  // What the cache may keep beyond the blocks in use.
  static constexpr size_t kMaxCachedBytes = size_t{256} << 20;

  // A block of nbytes: a cached one of that size, or a new one (raises on
  // out of memory).
  void* take(size_t nbytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(nbytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= nbytes;
        live_.emplace(p, nbytes);
        return p;
      }
    }
    void* p = c10::alloc_cpu(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(p, nbytes);
    return p;
  }

  // Takes p back (kept or freed); false if p is not a block of this cache.
  bool give(void* p) noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      return false;
    }
    const size_t nbytes = it->second;
    live_.erase(it);
    if (cached_ + nbytes <= kMaxCachedBytes) {
      free_[nbytes].push_back(p);
      cached_ += nbytes;
      return true;
    }
    lock.unlock();
    c10::free_cpu(p);
    return true;
  }

  // Frees the cached blocks (not those in use).
  void release() noexcept {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, list] : free_) {
        blocks.insert(blocks.end(), list.begin(), list.end());
      }
      free_.clear();
      cached_ = 0;
    }
    for (void* p : blocks) {
      c10::free_cpu(p);
    }
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

  // A forked child inherits the mutex as it was: the fork holds it.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

 private:
  std::mutex mutex_;                        // guards the members below
  ska::flat_hash_map<void*, size_t> live_;  // blocks in use, by address
  ska::flat_hash_map<size_t, std::vector<void*>> free_;  // reusable, by size
  size_t cached_ = 0;                                    // bytes in free_
};

// A BlockCache as the process's CPU allocator, in front of the one that was
// in place: Derived's allocate() serves a thread's large temporaries from
// the cache while that thread runs a device kernel (cached()) and passes
// everything else on (passed_on()); a block of either is freed through this
// allocator. Derived (final) declares `static Derived* instance` and
// `static constexpr const char* kName`, and may hide give() and the fork
// hooks to own more than the cache's blocks
// (engine/memory/OpenRegKernelScratch.cpp also hands out device memory).
template <class Derived>
class FrontAllocator : public c10::Allocator {
 public:
  explicit FrontAllocator(c10::Allocator* fallback) : fallback_(fallback) {}

  // Installs one Derived, once, in front of the CPU allocator in place; false
  // if that one has no raw interface to fall back on. Never freed: blocks it
  // gave may be freed until the process ends.
  static bool install() {
    static const bool ok = [] {
      c10::Allocator* previous = c10::GetCPUAllocator();
      if (previous == nullptr || previous->raw_deleter() == nullptr) {
        return false;
      }
      Derived::instance = new Derived(previous);
      c10::SetCPUAllocator(Derived::instance, /*priority=*/0);
      pthread_atfork([] { Derived::instance->lock_for_fork(); },
                     [] { Derived::instance->unlock_after_fork(); },
                     [] { Derived::instance->unlock_after_fork(); });
      return true;
    }();
    return ok;
  }

  // Frees blocks of this cache and of the allocator before it alike.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_free; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // Takes p back if it is a block of the cache.
  bool give(void* p) noexcept { return blocks_.give(p); }

  void release() noexcept { blocks_.release(); }
  size_t cached_bytes() { return blocks_.cached_bytes(); }

  // A forked child inherits the cache's mutex as it was: the fork holds it.
  void lock_for_fork() { blocks_.lock_for_fork(); }
  void unlock_after_fork() { blocks_.unlock_after_fork(); }

 protected:
  c10::DataPtr passed_on(size_t nbytes) { return fallback_->allocate(nbytes); }

  // A block of the cache. Data and context are the same address, as
  // raw_allocate requires (oneDNN takes its scratchpad through it).
  c10::DataPtr cached(size_t nbytes) {
    void* p = blocks_.take(nbytes);
    return {p, p, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  // A deleter: takes p back through Derived's give() (deleters must not
  // throw).
  static void free_block(void* p) {
    if (!Derived::instance->give(p)) {
      TORCH_WARN("openreg ", Derived::kName, ": freeing unknown block ", p);
    }
  }

 private:
  static void raw_free(void* p) {
    if (p != nullptr && !Derived::instance->give(p)) {
      static_cast<FrontAllocator*>(Derived::instance)
          ->fallback_->raw_deleter()(p);
    }
  }

  c10::Allocator* fallback_;
  BlockCache blocks_;
};

}  // namespace openreg
