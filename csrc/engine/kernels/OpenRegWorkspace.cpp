// SIMULATOR ONLY: the kernel library's workspace (see the header).
#include "engine/kernels/OpenRegWorkspace.h"

#include "engine/kernels/OpenRegBlockCache.h"
#include "engine/kernels/OpenRegReservedBlocks.h"

namespace openreg::kernels {

namespace {

thread_local bool t_workspace = false;

class WorkspaceAllocator final : public FrontAllocator<WorkspaceAllocator> {
 public:
  static constexpr const char* kName = "workspace";
  static WorkspaceAllocator* instance;

  using FrontAllocator::FrontAllocator;

  c10::DataPtr allocate(size_t nbytes) override {
    if (!t_workspace || nbytes < BlockCache::kMinBytes) {
      return passed_on(nbytes);
    }
    check_allocation_limit(nbytes);
    if (c10::DataPtr reserved = take_reserved_block(nbytes)) {
      return reserved;
    }
    return cached(nbytes);
  }
};

WorkspaceAllocator* WorkspaceAllocator::instance = nullptr;

}  // namespace

WorkspaceScope::WorkspaceScope() : previous_(t_workspace) {
  t_workspace = WorkspaceAllocator::install();
}

WorkspaceScope::~WorkspaceScope() { t_workspace = previous_; }

void release_workspace() noexcept {
  if (WorkspaceAllocator::instance != nullptr) {
    WorkspaceAllocator::instance->release();
  }
}

size_t workspace_cached_bytes() {
  return WorkspaceAllocator::instance != nullptr
             ? WorkspaceAllocator::instance->cached_bytes()
             : 0;
}

}  // namespace openreg::kernels
