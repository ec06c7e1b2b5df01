// Steady growth of a device's allocated bytes, for the out-of-memory
// message: a training loop that keeps tensors alive from step to step (a
// loss summed with its graph, a list of outputs) runs out of memory at some
// step, and "set a larger device" is then the wrong advice. The allocated
// bytes' low point is taken over windows of kWindow allocations; when it
// rose at every one of the last kKept windows, the message says so, with
// the numbers. Not thread-safe: the device cache's mutex guards it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace openreg {

class GrowthWatch {
 public:
  static constexpr uint32_t kWindow = 256;
  static constexpr size_t kKept = 8;

  // The allocated bytes after an allocation or a free.
  void allocated(size_t now) {
    low_ = std::min(low_, now);
    if (++count_ == kWindow) {
      lows_[next_ % kKept] = low_;
      ++next_;
      low_ = now;
      count_ = 0;
    }
  }
  void freed(size_t now) { low_ = std::min(low_, now); }

  // "" unless the low point rose at each of the last kKept windows by at
  // least 1/20 of `capacity` in all; `format` formats a size.
  template <typename Format>
  std::string report(size_t capacity, size_t peak, Format format) const {
    if (next_ < kKept) {
      return "";
    }
    const size_t first = lows_[next_ % kKept];  // the oldest kept
    size_t previous = first;
    for (size_t i = 1; i < kKept; ++i) {
      const size_t low = lows_[(next_ + i) % kKept];
      if (low <= previous) {
        return "";
      }
      previous = low;
    }
    if (previous - first < capacity / 20) {
      return "";
    }
    return " The allocated memory grew steadily before this: its low point "
           "rose in each of the last " +
           std::to_string(kKept) + " windows of " + std::to_string(kWindow) +
           " allocations, from " + format(first) + " to " + format(previous) +
           " (" + format((previous - first) / (kKept - 1)) +
           " a window; peak " + format(peak) +
           "). Something may keep tensors alive from step to step (a loss "
           "summed with its graph: use loss.item() or loss.detach(); a list "
           "of outputs); torch.openreg.memory_snapshot() shows what is "
           "allocated.";
  }

 private:
  size_t low_ = SIZE_MAX;
  uint32_t count_ = 0;
  std::array<size_t, kKept> lows_{};
  size_t next_ = 0;  // windows completed
};

}  // namespace openreg
