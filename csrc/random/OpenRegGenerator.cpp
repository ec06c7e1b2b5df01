#include "random/OpenRegGenerator.h"

#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <mutex>

#include "core/OpenRegFunctions.h"

namespace openreg {

// [doc:generator-impl]
OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device,
                                           uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

// Each accessor locks the inner generator: kernels lock that one while they
// draw numbers, so state changes never interleave with a kernel.
void OpenRegGeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.set_current_seed(seed);
}
// [/doc:generator-impl]

uint64_t OpenRegGeneratorImpl::current_seed() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.current_seed();
}

uint64_t OpenRegGeneratorImpl::seed() {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.seed();
}

// [doc:generator-offset]
void OpenRegGeneratorImpl::set_offset(uint64_t /*offset*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "openreg generators are Mersenne-Twister based "
                              "and have no Philox offset; use set_state");
}
// [/doc:generator-offset]

uint64_t OpenRegGeneratorImpl::get_offset() const {
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "openreg generators are Mersenne-Twister based "
                              "and have no Philox offset; use get_state");
}

void OpenRegGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.set_state(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(
      const_cast<c10::TensorImpl*>(&new_state))));
}

c10::intrusive_ptr<c10::TensorImpl> OpenRegGeneratorImpl::get_state() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.get_state().getIntrusivePtr();
}

OpenRegGeneratorImpl* OpenRegGeneratorImpl::clone_impl() const {
  auto* copy = new OpenRegGeneratorImpl(device().index(), 0);
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  copy->cpu_ = cpu_.clone();
  return copy;
}

// [doc:generator-default]
const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<at::Generator, kMaxDevices> generators;
  if (device < 0) {
    device = current_device();
  }
  check_device_index(device);
  auto i = static_cast<size_t>(device);
  std::call_once(once[i], [i, device] {
    generators[i] = at::make_generator<OpenRegGeneratorImpl>(
        device, at::default_rng_seed_val);
  });
  return generators[i];
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) {
    device = current_device();
  }
  check_device_index(device);
  return at::make_generator<OpenRegGeneratorImpl>(device,
                                                  at::default_rng_seed_val);
}

at::Generator kernel_generator(const std::optional<at::Generator>& gen,
                               c10::DeviceIndex device) {
  const at::Generator& g =
      gen.has_value() && gen->defined() ? *gen : default_generator(device);
  TORCH_CHECK(g.device().type() == c10::DeviceType::PrivateUse1,
              "Expected an openreg generator for an operation on openreg, got "
              "a generator of ",
              g.device());
  return g.get<OpenRegGeneratorImpl>()->cpu_generator();
}
// [/doc:generator-default]

}  // namespace openreg
