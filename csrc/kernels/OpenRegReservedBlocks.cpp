// SIMULATOR ONLY: see the header.
#include "kernels/OpenRegReservedBlocks.h"

#include <cstddef>
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
