// SIMULATOR ONLY: the kernel library's workspace (see the header).
#include "kernels/OpenRegWorkspace.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <cstring>
#include <mutex>

#include "kernels/OpenRegBlockCache.h"

namespace openreg::kernels {

namespace {

thread_local bool t_workspace = false;

class WorkspaceAllocator final : public c10::Allocator {
 public:
  explicit WorkspaceAllocator(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (!t_workspace || nbytes < BlockCache::kMinBytes) {
      return fallback_->allocate(nbytes);
    }
    void* p = blocks_.take(nbytes);
    // Data and context are the same address, as raw_allocate requires
    // (oneDNN takes its scratchpad through raw_allocate).
    return {p, p, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  // Frees blocks of this cache and of the allocator before it alike.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_free; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

  BlockCache& blocks() { return blocks_; }

  static WorkspaceAllocator* instance;

 private:
  static void free_block(void* p) {
    if (!instance->blocks_.give(p)) {
      TORCH_WARN("openreg workspace: freeing unknown block ", p);
    }
  }

  static void raw_free(void* p) {
    if (p != nullptr && !instance->blocks_.give(p)) {
      instance->fallback_->raw_deleter()(p);
    }
  }

  c10::Allocator* fallback_;
  BlockCache blocks_;
};

WorkspaceAllocator* WorkspaceAllocator::instance = nullptr;

// Installs the workspace once, in front of the CPU allocator in place (if
// that one has a raw interface to fall back on); false if it cannot.
bool installed() {
  static const bool ok = [] {
    c10::Allocator* previous = c10::GetCPUAllocator();
    if (previous == nullptr || previous->raw_deleter() == nullptr) {
      return false;
    }
    WorkspaceAllocator::instance = new WorkspaceAllocator(previous);  // kept
    c10::SetCPUAllocator(WorkspaceAllocator::instance, /*priority=*/0);
    pthread_atfork(
        [] { WorkspaceAllocator::instance->blocks().lock_for_fork(); },
        [] { WorkspaceAllocator::instance->blocks().unlock_after_fork(); },
        [] { WorkspaceAllocator::instance->blocks().unlock_after_fork(); });
    return true;
  }();
  return ok;
}

}  // namespace

WorkspaceScope::WorkspaceScope() : previous_(t_workspace) {
  t_workspace = installed();
}

WorkspaceScope::~WorkspaceScope() { t_workspace = previous_; }

void release_workspace() noexcept {
  if (WorkspaceAllocator::instance != nullptr) {
    WorkspaceAllocator::instance->blocks().release();
  }
}

size_t workspace_cached_bytes() {
  return WorkspaceAllocator::instance != nullptr
             ? WorkspaceAllocator::instance->blocks().cached_bytes()
             : 0;
}

}  // namespace openreg::kernels
