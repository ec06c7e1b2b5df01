// The per-device random number generator.
//
// The device computes with the host's kernels, so its generator holds the
// state of a CPU generator (mt19937 + normal cache). Kernels that draw random
// numbers receive that inner CPU generator; seeding, state and cloning are
// those of torch.Generator("openreg:N").
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

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
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The generator kernels use. Callers lock this object's mutex_ (kernels
  // lock the inner generator's mutex themselves).
  const at::Generator& cpu_generator() const { return cpu_; }

 private:
  OpenRegGeneratorImpl* clone_impl() const override;

  mutable at::Generator cpu_;  // mutable: locking its mutex is not a change
};

// The default generator of a device (-1: the current device).
const at::Generator& default_generator(c10::DeviceIndex device = -1);
// A fresh generator for a device, seeded with the default seed.
at::Generator new_generator(c10::DeviceIndex device = -1);
// The CPU generator a kernel should use for `gen` (an openreg generator) or,
// when gen is undefined, for the default generator of `device`.
at::Generator kernel_generator(const std::optional<at::Generator>& gen,
                               c10::DeviceIndex device);

}  // namespace openreg
