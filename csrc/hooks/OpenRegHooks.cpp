// The PrivateUse1 hooks: how PyTorch's device-generic code (Context,
// pin_memory, generators, storage resize, torch.accelerator) reaches openreg.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>

#include "aten/OpenRegResize.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "memory/OpenRegAllocator.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

namespace {

// [doc:hooks]
struct OpenRegHooks final : public at::PrivateUse1HooksInterface {
  void init() const override { lazy_init(); }

  bool isBuilt() const override { return true; }

  bool isAvailable() const override { return device_count() > 0; }

  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    check_device_index(device_index);
    return is_initialized();
  }

  c10::DeviceIndex deviceCount() const override { return device_count(); }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_device(device);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return openreg::exchange_device(device);
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return openreg::maybe_exchange_device(device);
  }

  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    orPointerAttributes attr;
    OPENREG_CHECK(orPointerGetAttributes(&attr, data));
    TORCH_CHECK(attr.type == orMemoryTypeDevice, "The pointer ", data,
                " is not openreg device memory");
    return at::Device(c10::DeviceType::PrivateUse1,
                      static_cast<c10::DeviceIndex>(attr.device));
  }

  bool isPinnedPtr(const void* data) const override {
    return is_pinned_ptr(data);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    lazy_init();
    return host_allocator();
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t newsize) const override {
    resize_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};
// [/doc:hooks]

// [doc:hooks-register]
// Registered at load time; registration does not touch the runtime.
const bool g_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new OpenRegHooks());
  return true;
}();
// [/doc:hooks-register]

}  // namespace

}  // namespace openreg
