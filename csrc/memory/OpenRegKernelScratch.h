// SIMULATOR ONLY: host memory for the temporaries of the CPU kernels that
// run as device kernels.
//
// A CPU kernel allocates temporaries with the CPU allocator: convolution
// computes into a temporary output, oneDNN takes a scratchpad, a
// TensorIterator casts an input. The C library hands out large blocks with
// mmap and takes them back with munmap, so every call of such a kernel
// page-faults its temporaries again (a 64-channel 56x56 convolution spent 0.8
// of its 2 ms in page faults on the stream worker). On a real device these
// are workspace memory from the device's caching allocator, reused from call
// to call. The simulator does the same for the host memory its kernels use:
// while a KernelScratchScope is alive on a thread (the stream worker runs
// every kernel in one), that thread's CPU allocations of at least 64 KiB come
// from a cache of host blocks of the sizes asked before. Every other
// allocation, and every allocation of every other thread, goes to the CPU
// allocator that was installed before (the CPU itself is not changed).
//
// Thread-safety: a block may be freed on any thread; the cache has a mutex.
#pragma once

#include <cstddef>

namespace openreg {

// While alive, the calling thread's large CPU allocations use the cache.
class KernelScratchScope {
 public:
  KernelScratchScope();
  ~KernelScratchScope();
  KernelScratchScope(const KernelScratchScope&) = delete;
  KernelScratchScope& operator=(const KernelScratchScope&) = delete;

 private:
  bool previous_;
};

// Frees the cached blocks that no kernel holds (torch.openreg.empty_cache).
void release_kernel_scratch() noexcept;

// Bytes the cache holds for reuse.
size_t kernel_scratch_cached_bytes();

}  // namespace openreg
