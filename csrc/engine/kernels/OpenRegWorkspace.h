// SIMULATOR ONLY: the device's workspace for the CPU kernels the kernel
// library runs (libopenreg_kernels.so, with either driver).
//
// While a WorkspaceScope is alive on a thread (the library's kernels open
// one), that thread's CPU allocations of at least BlockCache::kMinBytes come
// from a BlockCache (engine/kernels/OpenRegBlockCache.h): a convolution's
// output temporary and oneDNN's scratchpad are reused from call to call instead
// of being page-faulted in again (a small CNN training step: 1500 page faults
// per step without it, 250-450 with it). The cache is installed as the
// process's CPU allocator, in front of the one in place, the first time a
// scope opens; every other allocation goes to that one. With the thread
// driver that is the PyTorch layer's own
// (engine/memory/OpenRegKernelScratch.h), in a device process the CPU's.
//
// The library is linked with -z nodelete: once installed, the allocator
// must outlive every block it gave, so the library is never unmapped.
#pragma once

#include <cstddef>

namespace openreg::kernels {

class WorkspaceScope {
 public:
  WorkspaceScope();
  ~WorkspaceScope();
  WorkspaceScope(const WorkspaceScope&) = delete;
  WorkspaceScope& operator=(const WorkspaceScope&) = delete;

 private:
  bool previous_;
};

// [/doc:reserved-results-device]

// Frees the workspace's cached blocks (torch.openreg.empty_cache launches
// openreg_release_workspace on each device).
void release_workspace() noexcept;

// Bytes the workspace keeps beyond the blocks in use.
size_t workspace_cached_bytes();

}  // namespace openreg::kernels
