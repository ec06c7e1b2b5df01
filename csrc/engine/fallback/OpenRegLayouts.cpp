#include "engine/fallback/OpenRegLayouts.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>

#include "core/OpenRegStream.h"
#include "engine/memory/OpenRegKernelScratch.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegMemcpy.h"

namespace openreg {

namespace {

bool is_compressed(c10::Layout layout) {
  return layout == c10::kSparseCsr || layout == c10::kSparseCsc ||
         layout == c10::kSparseBsr || layout == c10::kSparseBsc;
}

// A strided CPU result as a device tensor (see device_tensor).
at::Tensor strided_to_device(const at::Tensor& t, const KernelViews& views,
                             c10::Device device) {
  if (const c10::Storage* storage = views.device_storage_of(t)) {
    return device_alias(*storage, t);  // a view of an input
  }
  if (c10::DataPtr memory = take_device_memory(t.storage())) {
    // Computed in device memory already: the device tensor takes it.
    c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                         std::move(memory), device_allocator(),
                         /*resizable=*/true);
    return device_alias(storage, t);
  }
  return copy_to_device(t, device);
}

}  // namespace

at::Tensor kernel_tensor(const at::Tensor& t, KernelViews& views) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
    return t;
  }
  const c10::Layout layout = t.layout();
  const auto cpu = t.options().device(c10::kCPU);
  if (layout == c10::kSparse) {
    return at::_sparse_coo_tensor_with_dims_and_tensors(
        t.sparse_dim(), t.dense_dim(), t.sizes(), views.view(t._indices()),
        views.view(t._values()), cpu, t.is_coalesced());
  }
  if (is_compressed(layout)) {
    // The impl's own parts: crow_indices() and values() return new aliases,
    // temporaries (see view_of_temporary).
    const at::SparseCsrTensorImpl* impl =
        at::sparse_csr::get_sparse_csr_impl(t);
    return at::_sparse_compressed_tensor_unsafe(
        views.view(impl->compressed_indices()),
        views.view(impl->plain_indices()), views.view(impl->values()),
        t.sizes(), cpu.layout(layout));
  }
  if (t.is_nested()) {
    const at::native::NestedTensorImpl* impl =
        at::native::get_nested_tensor_impl(t);
    return at::detail::make_tensor<at::native::NestedTensorImpl>(
        views.view_of_temporary(impl->get_unsafe_storage_as_tensor()),
        impl->get_nested_sizes(), impl->get_nested_strides(),
        impl->get_storage_offsets());
  }
  return views.view(t);
}

at::Tensor device_tensor(const at::Tensor& cpu, const KernelViews& views,
                         c10::Device device) {
  if (!cpu.defined() || !cpu.device().is_cpu()) {
    return cpu;
  }
  const c10::Layout layout = cpu.layout();
  const auto options = cpu.options().device(device);
  if (layout == c10::kSparse) {
    return at::_sparse_coo_tensor_with_dims_and_tensors(
        cpu.sparse_dim(), cpu.dense_dim(), cpu.sizes(),
        strided_to_device(cpu._indices(), views, device),
        strided_to_device(cpu._values(), views, device), options,
        cpu.is_coalesced());
  }
  if (is_compressed(layout)) {
    auto [compressed, plain] = at::sparse_csr::getCompressedPlainIndices(cpu);
    return at::_sparse_compressed_tensor_unsafe(
        strided_to_device(compressed, views, device),
        strided_to_device(plain, views, device),
        strided_to_device(cpu.values(), views, device), cpu.sizes(), options);
  }
  if (cpu.is_nested()) {
    const at::native::NestedTensorImpl* impl =
        at::native::get_nested_tensor_impl(cpu);
    return at::detail::make_tensor<at::native::NestedTensorImpl>(
        strided_to_device(impl->get_unsafe_storage_as_tensor(), views, device),
        impl->get_nested_sizes(), impl->get_nested_strides(),
        impl->get_storage_offsets());
  }
  TORCH_CHECK_NOT_IMPLEMENTED(layout == c10::kStrided,
                              "openreg has no tensors of layout ", layout);
  if (cpu._is_zerotensor()) {
    return copy_to_device(cpu, device);
  }
  return strided_to_device(cpu, views, device);
}

void sync_tensor(const at::Tensor& dev, const at::Tensor& cpu,
                 const KernelViews& views, void* base) {
  const c10::Device device = dev.device();
  if (dev.layout() == c10::kSparse) {
    at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(dev);
    impl->raw_resize_(cpu.sparse_dim(), cpu.dense_dim(), cpu.sizes());
    impl->set_indices_and_values_unsafe(
        strided_to_device(cpu._indices(), views, device),
        strided_to_device(cpu._values(), views, device));
    impl->set_coalesced(cpu.is_coalesced());
    return;
  }
  if (is_compressed(dev.layout())) {
    auto [compressed, plain] = at::sparse_csr::getCompressedPlainIndices(cpu);
    at::sparse_csr::get_sparse_csr_impl(dev)->set_member_tensors(
        strided_to_device(compressed, views, device),
        strided_to_device(plain, views, device),
        strided_to_device(cpu.values(), views, device), cpu.sizes());
    return;
  }
  if (dev.is_nested()) {
    return;  // written in place; nested tensors are never resized
  }
  c10::TensorImpl* impl = dev.unsafeGetTensorImpl();
  if (cpu.storage().data() != base) {
    // The CPU kernel grew the storage (its new bytes include the old ones):
    // the device storage takes the new memory, or a copy of it, ordered on
    // the current stream like every write of this call.
    c10::StorageImpl* storage = dev.storage().unsafeGetStorageImpl();
    const size_t nbytes = cpu.storage().nbytes();
    TORCH_CHECK(storage->resizable(),
                "Trying to resize storage that is not resizable");
    if (c10::DataPtr memory = take_device_memory(cpu.storage())) {
      storage->set_data_ptr_noswap(std::move(memory));  // no copy needed
      storage->set_nbytes(nbytes);
    } else {
      storage->set_data_ptr_noswap(
          nbytes == 0 ? c10::DataPtr(nullptr, device)
                      : storage->allocator()->allocate(nbytes));
      storage->set_nbytes(nbytes);
      memcpy_blocking(storage->mutable_data(), cpu.storage().data(), nbytes,
                      orMemcpyHostToDevice, getCurrentStream(device.index()));
    }
  }
  if (dev.sizes() != cpu.sizes() || dev.strides() != cpu.strides() ||
      dev.storage_offset() != cpu.storage_offset()) {
    impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(),
                                cpu.storage_offset());
  }
  // Some kernels return their out= result as a conjugate or negative view
  // (linalg_lu_solve with left=False sets the conjugate bit on `result`).
  if (dev.is_conj() != cpu.is_conj()) {
    impl->_set_conj(cpu.is_conj());
  }
  if (dev.is_neg() != cpu.is_neg()) {
    impl->_set_neg(cpu.is_neg());
  }
}

}  // namespace openreg
