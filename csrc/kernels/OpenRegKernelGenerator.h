// The CPU generator a device kernel draws its random numbers from.
//
// A random op reserves a draw (seed, offset) on the host at the launch, in
// program order (random/OpenRegGenerator.h); the kernel makes its generator
// from that draw where it runs, on the stream's worker or in the device
// process, so its numbers depend on the draw alone.
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>

namespace openreg {

at::Generator kernel_generator(uint64_t seed, uint64_t offset);

}  // namespace openreg
