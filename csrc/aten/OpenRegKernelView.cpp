#include "aten/OpenRegKernelView.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

namespace openreg {

void* kernel_base(const c10::Storage& storage) {
  const void* base = storage.data();
  if (base == nullptr) {
    return nullptr;
  }
  void* kernel = nullptr;
  OPENREG_CHECK(orGetKernelPointer(&kernel, base));
  return kernel;
}

at::Tensor kernel_view(const at::Tensor& t, bool resizable) {
  TORCH_INTERNAL_ASSERT(t.device().type() == c10::DeviceType::PrivateUse1);
  const c10::Storage& storage = t.storage();
  void* base = kernel_base(storage);
  // Non-owning: the device tensor keeps the memory alive.
  c10::DataPtr data(base, c10::Device(c10::DeviceType::CPU));
  auto cpu_storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(data),
      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(std::move(cpu_storage)),
      c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                    t.storage_offset());
  view._set_conj(t.is_conj());
  view._set_neg(t.is_neg());
  return view;
}

at::Tensor device_alias(const c10::Storage& storage, const at::Tensor& like) {
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                   like.storage_offset());
  out._set_conj(like.is_conj());
  out._set_neg(like.is_neg());
  return out;
}

}  // namespace openreg
