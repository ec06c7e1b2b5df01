// SIMULATOR ONLY: the host block cache of KernelScratchScope (see the
// header), installed as the process's CPU allocator in front of the one that
// was there, to which it passes everything that is not a kernel's large
// temporary.
#include "engine/memory/OpenRegKernelScratch.h"

#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>
#include <openreg.h>

#include <mutex>
#include <utility>
#include <vector>

#include "core/OpenRegException.h"
#include "engine/kernels/OpenRegBlockCache.h"
#include "memory/OpenRegAllocator.h"

namespace openreg {

namespace {

thread_local bool t_scratch = false;
// The stream of the KernelMemoryOnDevice scope alive on this thread, and
// the most bytes an allocation the device refuses may take on the host.
thread_local std::optional<c10::Stream> t_device_stream;
thread_local size_t t_spill_limit = 0;

constexpr size_t kMinBytes = BlockCache::kMinBytes;

// [doc:kernel-scratch]
class ScratchAllocator final : public FrontAllocator<ScratchAllocator> {
 public:
  static constexpr const char* kName = "kernel scratch";
  static ScratchAllocator* instance;

  using FrontAllocator::FrontAllocator;

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes >= kMinBytes && t_device_stream.has_value()) {
      if (c10::DataPtr p = on_device(nbytes, *t_device_stream)) {
        return p;
      }
      if (nbytes > t_spill_limit) {
        // Only a result can be this large: refused as the device refuses
        // it (the message has the numbers of the failed allocation).
        (void)allocate_device_memory(nbytes, *t_device_stream);
      }
      // Perhaps a temporary the CPU kernel needs and a device kernel would
      // not: host memory, like the temporaries of queued kernels.
    }
    if (!t_scratch || nbytes < kMinBytes) {
      return passed_on(nbytes);
    }
    return cached(nbytes);
  }

  // The device memory behind kernel address p, handed to the caller.
  c10::DataPtr take_device(const void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = device_.find(const_cast<void*>(p));
    if (it == device_.end()) {
      return {};
    }
    // The entry stays, empty, until the CPU storage frees p.
    return std::move(it->second);
  }

  // Takes p back if it is a block of the cache or device memory it gave.
  bool give(void* p) noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    if (auto d = device_.find(p); d != device_.end()) {
      c10::DataPtr memory = std::move(d->second);
      device_.erase(d);
      lock.unlock();
      return true;  // `memory` returns to the caching allocator, if still ours
    }
    lock.unlock();
    return FrontAllocator::give(p);
  }

  // A forked child inherits the mutexes as they were: the fork holds them.
  void lock_for_fork() {
    mutex_.lock();
    FrontAllocator::lock_for_fork();
  }
  void unlock_after_fork() {
    FrontAllocator::unlock_after_fork();
    mutex_.unlock();
  }

 private:
  // Device memory for a kernel's allocation, at its kernel address (data
  // and context alike, as raw_allocate requires); empty if the device cannot
  // hold it.
  c10::DataPtr on_device(size_t nbytes, c10::Stream stream) {
    c10::DataPtr memory = try_allocate_device_memory(nbytes, stream);
    if (!memory) {
      return {};
    }
    void* p = nullptr;
    OPENREG_CHECK(orGetKernelPointer(&p, memory.get()));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      device_.emplace(p, std::move(memory));
    }
    return {p, p, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  std::mutex mutex_;  // guards device_
  // Device memory given to kernels, by kernel address (empty once taken).
  ska::flat_hash_map<void*, c10::DataPtr> device_;
};
// [/doc:kernel-scratch]

ScratchAllocator* ScratchAllocator::instance = nullptr;

// Installed when the extension loads, in front of the CPU allocator then in
// place (whose raw interface it must be able to fall back on).
const bool g_installed = ScratchAllocator::install();

}  // namespace

// The checks below ask whether this allocator was installed, not whether it
// is the current one: the kernel library's workspace
// (engine/kernels/OpenRegWorkspace.h) installs itself in front of it when the
// thread driver loads the library, and passes it what it does not serve.
bool begin_kernel_scratch() noexcept {
  const bool previous = t_scratch;
  t_scratch = g_installed;
  return previous;
}

void end_kernel_scratch(bool previous) noexcept { t_scratch = previous; }

KernelScratchScope::KernelScratchScope() : previous_(t_scratch) {
  t_scratch = g_installed;
}

KernelScratchScope::~KernelScratchScope() { t_scratch = previous_; }

KernelMemoryOnDevice::KernelMemoryOnDevice(c10::Stream stream,
                                           size_t spill_limit)
    : previous_stream_(t_device_stream), previous_limit_(t_spill_limit) {
  TORCH_INTERNAL_ASSERT(stream.device_type() == c10::DeviceType::PrivateUse1);
  if (g_installed) {
    t_device_stream = stream;
    t_spill_limit = spill_limit * kSpillFactor;
  }
}

KernelMemoryOnDevice::~KernelMemoryOnDevice() {
  t_device_stream = previous_stream_;
  t_spill_limit = previous_limit_;
}

c10::DataPtr take_device_memory(const c10::Storage& cpu) {
  if (!g_installed || !cpu.device().is_cpu() || cpu.data() == nullptr) {
    return {};
  }
  return ScratchAllocator::instance->take_device(cpu.data());
}

void release_kernel_scratch() noexcept {
  if (g_installed) {
    ScratchAllocator::instance->release();
  }
}

size_t kernel_scratch_cached_bytes() {
  return g_installed ? ScratchAllocator::instance->cached_bytes() : 0;
}

}  // namespace openreg
