// SIMULATOR ONLY: host memory for the temporaries of the CPU kernels that
// run as device kernels.
//
// A CPU kernel allocates temporaries with the CPU allocator (convolution
// computes into a temporary output, oneDNN takes a scratchpad, a
// TensorIterator casts an input), which page-faults large ones in again at
// every call; a real device takes them from its workspace
// (engine/kernels/OpenRegBlockCache.h). The kernel library's named kernels,
// every queued kernel of the PyTorch layer, use the library's workspace
// (engine/kernels/OpenRegWorkspace.h). The kernels the host runs from closures
// on the stream worker (a synchronous call, a captured fallback call) use this
// one: while a KernelScratchScope is alive on a thread, that thread's CPU
// allocations of at least 64 KiB come from a BlockCache. Every other
// allocation, and every allocation of every other thread, goes to the CPU
// allocator that was installed before (the CPU itself is not changed).
//
// Kernel memory on the device: while a KernelMemoryOnDevice scope is alive
// on a worker (a synchronous call the host runs from a closure: one the call
// format cannot carry, or any with OPENREG_DESCRIBED_CALLS=0; the others
// are described calls, engine/fallback/OpenRegDescribedCall.h), that thread's
// large CPU allocations are device memory instead, from the caching allocator
// on the call's stream, reached through the kernel view. The results of such a
// kernel are then already in device memory (take_device_memory hands them
// over without a copy), and a result the device cannot hold raises
// torch.OutOfMemoryError when the kernel allocates it, before it computes
// anything, as CUDA's allocator refuses a kernel's results before it runs
// (torch.outer of 12,000 floats on a 256 MiB device computed its 550 MB
// result in host memory first, and failed only when copying it).
//
// A CPU kernel may also need temporaries that a device kernel would not
// (summing uint8 into int64 casts the whole input first), which the device
// may not hold. So an allocation the device refuses is host memory instead
// when it is no larger than `spill_limit` times kSpillFactor (the largest
// argument's bytes: a cast of an input to the widest dtype is 16 times the
// bytes of a bool input at most); a larger one can only be a result, and
// raises. A result the device refuses that is no larger spills to the host
// and then fails to be copied to the device: host work bounded by the size
// of what the device already holds.
//
// Thread-safety: a block may be freed on any thread; the cache has a mutex.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <optional>

namespace openreg {

// KernelScratchScope's two halves, for a caller that cannot hold the scope
// (engine().enter_host_kernel): begin returns the state end restores.
bool begin_kernel_scratch() noexcept;
void end_kernel_scratch(bool previous) noexcept;

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

// While alive, the calling thread's large CPU allocations are device memory
// of `stream`'s device, allocated on `stream` (see above). Nests inside a
// KernelScratchScope and takes precedence over it.
class KernelMemoryOnDevice {
 public:
  static constexpr size_t kSpillFactor = 16;
  KernelMemoryOnDevice(c10::Stream stream, size_t spill_limit);
  ~KernelMemoryOnDevice();
  KernelMemoryOnDevice(const KernelMemoryOnDevice&) = delete;
  KernelMemoryOnDevice& operator=(const KernelMemoryOnDevice&) = delete;

 private:
  std::optional<c10::Stream> previous_stream_;
  size_t previous_limit_;
};

// If `cpu` (a CPU storage) is device memory a KernelMemoryOnDevice scope
// allocated: the device DataPtr of that memory, which the caller now owns
// (the CPU storage no longer frees it). An empty DataPtr otherwise.
c10::DataPtr take_device_memory(const c10::Storage& cpu);

// Frees the cached blocks that no kernel holds (torch.openreg.empty_cache).
void release_kernel_scratch() noexcept;

// Bytes the cache holds for reuse.
size_t kernel_scratch_cached_bytes();

}  // namespace openreg
