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
// Used by the kernel library's workspace (kernels/OpenRegWorkspace.cpp) and
// by the host's cache for the kernels it runs from closures
// (memory/OpenRegKernelScratch.cpp). Thread-safe: a block may be freed on
// any thread.
#pragma once

#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/flat_hash_map.h>

#include <cstddef>
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

}  // namespace openreg
