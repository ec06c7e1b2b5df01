// SIMULATOR ONLY: a described call's results made in the device memory the
// host reserved for them (kernel library, with either driver).
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace openreg::kernels {

// [doc:reserved-results-device]
// A described call's results written in place: the host allocated their
// device memory before the launch (the sizes its Meta kernel gave) and
// passes the blocks, as the addresses the kernel reaches them at. While a
// ReservedResults scope is alive on a thread inside a WorkspaceScope, an
// allocation of exactly a block's size takes that block (each at most once
// at a time), so the CPU kernel writes its result straight into device
// memory: no workspace page faults, and no copy when the host takes the
// result (openreg_take_results skips a result already in place).
class ReservedResults {
 public:
  // blocks: (kernel-view address, bytes), in the host's order.
  explicit ReservedResults(std::vector<std::pair<void*, size_t>> blocks);
  ~ReservedResults();
  ReservedResults(const ReservedResults&) = delete;
  ReservedResults& operator=(const ReservedResults&) = delete;

 private:
  void* previous_;  // the list the scope found
};

// The index of the reserved block of this thread's ReservedResults that
// starts at `data`, or -1.
int reserved_block_of(const void* data);

// A described call's limit on one allocation of its kernel
// (DescribeParams::workspace_limit), on this thread, for its scope.
class AllocationLimit {
 public:
  explicit AllocationLimit(size_t bytes, std::string op);
  ~AllocationLimit();
  AllocationLimit(const AllocationLimit&) = delete;
  AllocationLimit& operator=(const AllocationLimit&) = delete;

 private:
  size_t previous_;
  std::string previous_op_;
};
// For the workspace's allocator: raises torch.OutOfMemoryError when
// `nbytes` exceeds this thread's AllocationLimit.
void check_allocation_limit(size_t nbytes);

// For the workspace's allocator (engine/kernels/OpenRegWorkspace.cpp): a free
// reserved block of exactly `nbytes` on this thread, or an empty DataPtr.
c10::DataPtr take_reserved_block(size_t nbytes);

}  // namespace openreg::kernels
