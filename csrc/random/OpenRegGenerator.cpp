#include "random/OpenRegGenerator.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <array>
#include <cstring>
#include <memory>

#include "core/OpenRegFunctions.h"
#include "kernels/OpenRegKernelGenerator.h"

namespace openreg {

namespace {

constexpr size_t kStateBytes = 2 * sizeof(uint64_t);

}  // namespace

// [doc:generator-impl]
OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device,
                                           uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

std::pair<uint64_t, uint64_t> OpenRegGeneratorImpl::reserve(uint64_t count) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  const uint64_t first = offset_;
  offset_ += count;
  return {seed_, first};
}

void OpenRegGeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  seed_ = seed;
  offset_ = 0;
}
// [/doc:generator-impl]

uint64_t OpenRegGeneratorImpl::current_seed() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return seed_;
}

uint64_t OpenRegGeneratorImpl::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom();
  set_current_seed(random);
  return random;
}

// [doc:generator-offset]
void OpenRegGeneratorImpl::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  offset_ = offset;
}

uint64_t OpenRegGeneratorImpl::get_offset() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return offset_;
}
// [/doc:generator-offset]

void OpenRegGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  new_state.device().is_cpu(),
              "RNG state must be a torch.ByteTensor on the CPU");
  TORCH_CHECK(static_cast<size_t>(new_state.numel()) == kStateBytes,
              "Expected an openreg RNG state of ", kStateBytes,
              " bytes (seed and offset), got ", new_state.numel(),
              " bytes (a state saved by another device or an older openreg?)");
  std::array<uint64_t, 2> words{};
  std::memcpy(words.data(), new_state.data(), kStateBytes);
  std::lock_guard<std::mutex> lock(state_mutex_);
  seed_ = words[0];
  offset_ = words[1];
}

c10::intrusive_ptr<c10::TensorImpl> OpenRegGeneratorImpl::get_state() const {
  // A plain CPU tensor made without the dispatcher, as the CPU's and CUDA's
  // generators make theirs: under a functorch transform (torch.func.jvp,
  // vmap) at::empty would return the transform's wrapper, which has no
  // storage to write the state into (torch.compile reads the RNG state of
  // every device while it traces such a function).
  at::Tensor state =
      at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::kByte,
                            /*pin_memory=*/false, at::MemoryFormat::Contiguous);
  std::array<uint64_t, 2> words{};
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    words = {seed_, offset_};
  }
  std::memcpy(state.data_ptr(), words.data(), kStateBytes);
  return state.getIntrusivePtr();
}

void OpenRegGeneratorImpl::graphsafe_set_state(
    const c10::intrusive_ptr<c10::GeneratorImpl>& state) {
  auto* other = dynamic_cast<OpenRegGeneratorImpl*>(state.get());
  TORCH_CHECK(other != nullptr,
              "graphsafe_set_state expects the state of an openreg generator");
  const auto [seed, offset] = other->reserve(0);
  std::lock_guard<std::mutex> lock(state_mutex_);
  seed_ = seed;
  offset_ = offset;
}

c10::intrusive_ptr<c10::GeneratorImpl>
OpenRegGeneratorImpl::graphsafe_get_state() const {
  return c10::intrusive_ptr<c10::GeneratorImpl>::reclaim(clone_impl());
}

OpenRegGeneratorImpl* OpenRegGeneratorImpl::clone_impl() const {
  auto* copy = new OpenRegGeneratorImpl(device().index(), 0);
  std::lock_guard<std::mutex> lock(state_mutex_);
  copy->seed_ = seed_;
  copy->offset_ = offset_;
  return copy;
}

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

// [doc:generator-draw]
RandomDraw reserve_draw(const std::optional<at::Generator>& gen,
                        c10::DeviceIndex device) {
  const at::Generator& g =
      gen.has_value() && gen->defined() ? *gen : default_generator(device);
  TORCH_CHECK(g.device().type() == c10::DeviceType::PrivateUse1,
              "Expected an openreg generator for an operation on openreg, got "
              "a generator of ",
              g.device());
  // One position per launch: each launch gets a generator of its own.
  const auto [seed, offset] = g.get<OpenRegGeneratorImpl>()->reserve(1);
  return {seed, offset};
}

at::Generator kernel_generator(const RandomDraw& draw) {
  // Made where the kernel runs (kernels/OpenRegKernelGenerator.h), from the
  // draw alone.
  return kernel_generator(draw.seed, draw.offset);
}
// [/doc:generator-draw]

}  // namespace openreg
