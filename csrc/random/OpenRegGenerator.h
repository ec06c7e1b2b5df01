// The per-device random number generator: counter-based, like CUDA's Philox.
//
// Its state is a seed and an offset. Every random kernel launch reserves a
// range of the offset on the host, in program order, and draws from a
// generator derived from (seed, offset) when it runs, so random kernels can
// be queued on a stream like any other: the numbers depend only on the seed
// and the order of the launches, never on when the kernels run, and are the
// same with OPENREG_LAUNCH_BLOCKING=1. The derived generator is PyTorch's CPU
// generator (the CPU kernels draw from it), seeded from (seed, offset); the
// numbers are openreg's own stream, as CUDA's differ from the CPU's.
//
// The state tensor (get_state/set_state) is 16 bytes: the seed and the
// offset, both little-endian 64-bit, as CUDA's Philox state.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>
#include <mutex>
#include <utility>

namespace openreg {

class OpenRegGeneratorImpl final : public c10::GeneratorImpl {
 public:
  OpenRegGeneratorImpl(c10::DeviceIndex device, uint64_t seed);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  void graphsafe_set_state(
      const c10::intrusive_ptr<c10::GeneratorImpl>& state) override;
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // Reserves `count` positions of the counter for one kernel launch and
  // returns (seed, first position). Thread-safe.
  std::pair<uint64_t, uint64_t> reserve(uint64_t count);

 private:
  OpenRegGeneratorImpl* clone_impl() const override;

  mutable std::mutex state_mutex_;  // guards seed_ and offset_
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of a device (-1: the current device).
const at::Generator& default_generator(c10::DeviceIndex device = -1);
// A fresh generator for a device, seeded with the default seed.
at::Generator new_generator(c10::DeviceIndex device = -1);

// The counter range one launch draws from.
struct RandomDraw {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Reserves a launch's draw from `gen` (an openreg generator) or, when gen is
// undefined, from the default generator of `device`. Called on the host, in
// program order, at the launch.
RandomDraw reserve_draw(const std::optional<at::Generator>& gen,
                        c10::DeviceIndex device);

// The CPU generator a kernel draws from for `draw` (made where the kernel
// runs: the numbers depend on the draw only).
at::Generator kernel_generator(const RandomDraw& draw);

}  // namespace openreg
