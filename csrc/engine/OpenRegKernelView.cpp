#include "engine/OpenRegKernelView.h"

#include <ATen/ops/contiguous.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <cstring>
#include <memory>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "memory/OpenRegMemcpy.h"

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

namespace {

at::Tensor make_view(const c10::Storage& cpu_storage, caffe2::TypeMeta dtype,
                     c10::IntArrayRef sizes, c10::IntArrayRef strides,
                     int64_t storage_offset, bool conj, bool neg) {
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      dtype);
  view.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides,
                                                    storage_offset);
  if (conj) {
    view._set_conj(true);
  }
  if (neg) {
    view._set_neg(true);
  }
  return view;
}

}  // namespace

DeviceTensorRef::DeviceTensorRef(const at::Tensor& t)
    : storage(t.storage().unsafeGetStorageImpl()),
      storage_data(t.storage().data()),
      storage_nbytes(t.storage().nbytes()),
      sizes(t.sizes().begin(), t.sizes().end()),
      strides(t.strides().begin(), t.strides().end()),
      storage_offset(t.storage_offset()),
      dtype(t.dtype()),
      conj(t.is_conj()),
      neg(t.is_neg()) {
  TORCH_INTERNAL_ASSERT(t.device().type() == c10::DeviceType::PrivateUse1);
}

KernelViews::Entry& KernelViews::entry(const void* key,
                                       const c10::Storage* storage,
                                       const void* data, size_t nbytes) {
  for (Entry& e : entries_) {
    if (e.device == key) {
      return e;
    }
  }
  void* base = nullptr;
  // Non-owning: the device memory outlives the kernel (stream order).
  c10::DataPtr cpu_data(nullptr, c10::Device(c10::DeviceType::CPU));
  const bool staged = data != nullptr && !host_kernels_supported();
  if (staged) {
    // See "staged-views" in the header: a host copy, owned by the view.
    cpu_data = c10::GetCPUAllocator()->allocate(nbytes);
    base = cpu_data.get();
    memcpy_blocking(base, data, nbytes, orMemcpyDeviceToHost,
                    getCurrentStream(device_of_pointer(data)));
  } else if (data != nullptr) {
    OPENREG_CHECK(orGetKernelPointer(&base, data));
    cpu_data = c10::DataPtr(base, c10::Device(c10::DeviceType::CPU));
  }
  c10::Storage cpu_storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(cpu_data), nullptr,
      false));
  if (staged && StagedKernelScope::current() != nullptr) {
    StagedKernelScope::current()->add(data, cpu_storage);
  }
  entries_.push_back({key, storage != nullptr ? *storage : c10::Storage(),
                      std::move(cpu_storage), base});
  return entries_.back();
}

namespace {
thread_local StagedKernelScope* t_staged_scope = nullptr;
}  // namespace

StagedKernelScope::StagedKernelScope() : previous_(t_staged_scope) {
  t_staged_scope = this;
}

StagedKernelScope::~StagedKernelScope() { t_staged_scope = previous_; }

StagedKernelScope* StagedKernelScope::current() { return t_staged_scope; }

void StagedKernelScope::add(const void* device_data, const c10::Storage& cpu) {
  const size_t n = cpu.nbytes();
  auto original = std::make_unique<char[]>(n);
  std::memcpy(original.get(), cpu.data(), n);
  staged_.push_back({device_data, cpu, cpu.data(), std::move(original)});
}

void StagedKernelScope::write_back_changed() {
  for (const Staged& s : staged_) {
    const size_t n = s.cpu.nbytes();
    if (s.cpu.data() == s.base &&
        std::memcmp(s.base, s.original.get(), n) != 0) {
      memcpy_blocking(const_cast<void*>(s.device_data), s.base, n,
                      orMemcpyHostToDevice,
                      getCurrentStream(device_of_pointer(s.device_data)));
    }
  }
  staged_.clear();
}

at::Tensor KernelViews::view(const at::Tensor& t, bool resizable) {
  TORCH_INTERNAL_ASSERT(t.device().type() == c10::DeviceType::PrivateUse1);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = t.storage();
  Entry& e = entry(storage.unsafeGetStorageImpl(), &storage, storage.data(),
                   storage.nbytes());
  if (resizable && !e.cpu_storage.resizable()) {
    // The allocator first: a resizable storage must have one.
    e.cpu_storage.unsafeGetStorageImpl()->set_allocator(c10::GetCPUAllocator());
    e.cpu_storage.unsafeGetStorageImpl()->set_resizable(true);
  }
  for (const auto& [seen, v] : views_) {
    if (seen == impl) {
      return v;
    }
  }
  at::Tensor v = make_view(e.cpu_storage, t.dtype(), t.sizes(), t.strides(),
                           t.storage_offset(), t.is_conj(), t.is_neg());
  views_.emplace_back(impl, v);
  return v;
}

at::Tensor KernelViews::view_of_temporary(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.device().type() == c10::DeviceType::PrivateUse1);
  const c10::Storage& storage = t.storage();
  Entry& e = entry(storage.unsafeGetStorageImpl(), &storage, storage.data(),
                   storage.nbytes());
  return make_view(e.cpu_storage, t.dtype(), t.sizes(), t.strides(),
                   t.storage_offset(), t.is_conj(), t.is_neg());
}

at::Tensor KernelViews::view(const DeviceTensorRef& t) {
  for (const auto& [seen, v] : views_) {
    if (seen == &t) {
      return v;
    }
  }
  Entry& e = entry(t.storage, nullptr, t.storage_data, t.storage_nbytes);
  at::Tensor v = make_view(e.cpu_storage, t.dtype, t.sizes, t.strides,
                           t.storage_offset, t.conj, t.neg);
  views_.emplace_back(&t, v);
  return v;
}

const c10::Storage* KernelViews::device_storage_of(
    const at::Tensor& cpu) const {
  const c10::StorageImpl* impl = cpu.storage().unsafeGetStorageImpl();
  const void* data = cpu.storage().data();
  for (const Entry& e : entries_) {
    // The kernel view's own storage (a view of an input; an empty storage
    // has no address to match), or another over the same address.
    if (e.device_storage && (e.cpu_storage.unsafeGetStorageImpl() == impl ||
                             (data != nullptr && e.base == data))) {
      return &e.device_storage;
    }
  }
  return nullptr;
}

uint64_t device_address(const at::Tensor& t) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.const_data_ptr()));
}

at::Tensor borrowed_alias(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  c10::DataPtr data(const_cast<void*>(storage.data()), storage.device());
  c10::Storage borrowed(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(data),
      /*allocator=*/nullptr, /*resizable=*/false));
  return device_alias(borrowed, t);
}

at::Tensor copy_to_device(const at::Tensor& cpu, c10::Device device) {
  if (cpu._is_zerotensor()) {
    // An autograd "efficient zero" tensor has no memory: make real zeros.
    return at::zeros(cpu.sizes(), cpu.options().device(device));
  }
  at::Tensor src = cpu.is_non_overlapping_and_dense() ? cpu : cpu.contiguous();
  at::Tensor out = at::empty_strided(src.sizes(), src.strides(),
                                     src.options().device(device));
  // Ordered on the current stream; a pageable source makes it synchronous.
  memcpy_on_stream(out.data_ptr(), src.const_data_ptr(), src.nbytes(),
                   orMemcpyHostToDevice, getCurrentStream(device.index()));
  out._set_conj(src.is_conj());
  out._set_neg(src.is_neg());
  return out;
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
