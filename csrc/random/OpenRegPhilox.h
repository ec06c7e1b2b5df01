// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3" (SC 2011), which CUDA's random kernels
// also use. A counter-based generator has no state to carry from one number
// to the next: the i-th block of four numbers is a pure function of
// (key, counter = i), so a kernel can draw any part of its stream on any
// thread, in any order, and get the same numbers. That is what lets a random
// kernel split its work over threads and still be deterministic.
//
// openreg's fused kernels (dropout) key it with a launch's reserved draw
// (OpenRegGenerator.h): key = the seed, counter = (block index, offset).
#pragma once

#include <array>
#include <cstdint>

#include "random/OpenRegGenerator.h"

namespace openreg {

class Philox4x32 {
 public:
  using Block = std::array<uint32_t, 4>;

  // The stream of one launch's draw: block i is numbers 4i .. 4i+3.
  explicit Philox4x32(const RandomDraw& draw)
      : key_{static_cast<uint32_t>(draw.seed),
             static_cast<uint32_t>(draw.seed >> 32)},
        offset_{static_cast<uint32_t>(draw.offset),
                static_cast<uint32_t>(draw.offset >> 32)} {}

  Block block(uint64_t index) const {
    Block c{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
            offset_[0], offset_[1]};
    uint32_t k0 = key_[0];
    uint32_t k1 = key_[1];
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        k0 += kWeyl0;
        k1 += kWeyl1;
      }
      const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
      const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
      c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0,
           static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1,
           static_cast<uint32_t>(p0)};
    }
    return c;
  }

 private:
  static constexpr uint32_t kMul0 = 0xD2511F53u;
  static constexpr uint32_t kMul1 = 0xCD9E8D57u;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
  static constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
  std::array<uint32_t, 2> key_;
  std::array<uint32_t, 2> offset_;
};

}  // namespace openreg
