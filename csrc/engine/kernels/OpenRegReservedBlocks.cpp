// SIMULATOR ONLY: see the header.
#include "engine/kernels/OpenRegReservedBlocks.h"

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdio>
#include <utility>
#include <vector>

namespace openreg::kernels {

namespace {

// The described call's blocks on this thread (ReservedResults).
struct Reservation {
  void* data;
  size_t bytes;
  bool in_use;
};
thread_local std::vector<Reservation>* t_reserved = nullptr;

// A reserved block's deleter: the block belongs to the host's allocator;
// freeing it here only makes it available to the call again. Called on the
// kernel's thread while the scope lives, or later (the kept result), when
// nothing is reserved any more.
void give_back_reserved(void* data) {
  if (t_reserved == nullptr) {
    return;
  }
  for (Reservation& r : *t_reserved) {
    if (r.data == data) {
      r.in_use = false;
    }
  }
}

}  // namespace

namespace {
thread_local size_t t_limit = 0;
thread_local std::string t_limit_op;

std::string mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f MiB",
                static_cast<double>(bytes) / (1 << 20));
  return text;
}
}  // namespace

AllocationLimit::AllocationLimit(size_t bytes, std::string op)
    : previous_(t_limit), previous_op_(std::move(t_limit_op)) {
  t_limit = bytes;
  t_limit_op = std::move(op);
}

AllocationLimit::~AllocationLimit() {
  t_limit = previous_;
  t_limit_op = std::move(previous_op_);
}

void check_allocation_limit(size_t nbytes) {
  TORCH_CHECK_WITH(OutOfMemoryError, t_limit == 0 || nbytes <= t_limit,
                   "openreg out of memory. Tried to allocate ", mib(nbytes),
                   " in the kernel of ", t_limit_op,
                   ", whose results' sizes "
                   "depend on the data; the device has ",
                   mib(t_limit),
                   " free. Set OPENREG_DEVICE_MEMORY to simulate a larger "
                   "device.");
}

c10::DataPtr take_reserved_block(size_t nbytes) {
  if (t_reserved == nullptr) {
    return c10::DataPtr();
  }
  for (Reservation& r : *t_reserved) {
    if (!r.in_use && r.bytes == nbytes) {
      r.in_use = true;
      return {r.data, r.data, &give_back_reserved,
              c10::Device(c10::DeviceType::CPU)};
    }
  }
  return c10::DataPtr();
}

ReservedResults::ReservedResults(std::vector<std::pair<void*, size_t>> blocks)
    : previous_(nullptr) {
  auto* list = new std::vector<Reservation>();
  for (const auto& [data, bytes] : blocks) {
    list->push_back({data, bytes, false});
  }
  std::swap(t_reserved, list);
  previous_ = list;
}

ReservedResults::~ReservedResults() {
  delete t_reserved;
  t_reserved = static_cast<std::vector<Reservation>*>(previous_);
}

int reserved_block_of(const void* data) {
  if (t_reserved == nullptr || data == nullptr) {
    return -1;
  }
  for (size_t i = 0; i < t_reserved->size(); ++i) {
    if ((*t_reserved)[i].data == data) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace openreg::kernels
