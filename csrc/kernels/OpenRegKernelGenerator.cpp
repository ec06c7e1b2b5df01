#include "kernels/OpenRegKernelGenerator.h"

#include <ATen/CPUGeneratorImpl.h>

namespace openreg {

namespace {

// A 64-bit mix (splitmix64's finalizer): nearby (seed, offset) pairs give
// unrelated generator seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// [doc:kernel-generator]
at::Generator kernel_generator(uint64_t seed, uint64_t offset) {
  // The Mersenne Twister's whole state comes from a splitmix64 stream keyed
  // by (seed, offset): 2^64 distinct streams (seeding it with an integer
  // would use only 32 bits of the key).
  const uint64_t key = mix(seed ^ mix(offset));
  at::mt19937_data_pod pod{};
  pod.seed_ = key;
  pod.left_ = 1;
  pod.seeded_ = true;
  pod.next_ = 0;
  uint64_t x = key;
  for (uint32_t& word : pod.state_) {
    x = mix(x);
    word = static_cast<uint32_t>(x >> 32);
  }
  pod.state_[0] |= 0x80000000u;  // never the all-zero state
  at::mt19937 engine;
  engine.set_data(pod);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(key);
  gen.get<at::CPUGeneratorImpl>()->set_engine(engine);
  return gen;
}
// [/doc:kernel-generator]

}  // namespace openreg
