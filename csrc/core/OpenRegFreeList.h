// A thread's bounded stock of reusable objects, so that a launch allocates
// nothing in steady state: take() reuses an object or makes a new one,
// give() keeps up to kMax and deletes the rest. Not thread-safe: each thread
// holds its own (thread_local), and objects go back to the thread that
// launched them.
#pragma once

#include <cstddef>
#include <vector>

namespace openreg {

template <typename T, size_t kMax = 256>
class FreeList {
 public:
  FreeList() { free_.reserve(kMax); }
  FreeList(const FreeList&) = delete;
  FreeList& operator=(const FreeList&) = delete;
  ~FreeList() {
    for (T* t : free_) {
      delete t;
    }
  }

  T* take() {
    if (free_.empty()) {
      return new T;
    }
    T* t = free_.back();
    free_.pop_back();
    return t;
  }

  void give(T* t) noexcept {
    if (free_.size() >= kMax) {
      delete t;
      return;
    }
    free_.push_back(t);  // reserved: does not allocate
  }

 private:
  std::vector<T*> free_;
};

}  // namespace openreg
