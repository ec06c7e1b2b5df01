// The native kernels every backend needs: allocation, views, resizing, set_,
// and reading a scalar back. Everything else reaches the device through the
// copies (OpenRegCopy.cpp) and the fallback (OpenRegFallback.cpp).
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)
#include "aten/OpenRegResize.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegMemcpy.h"

namespace openreg {

namespace {

constexpr auto kKeySet = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

void check_factory_args(std::optional<c10::Layout> layout,
                        std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "openreg supports only strided tensors, got layout ", *layout);
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "Only dense CPU tensors can be pinned; an openreg tensor lives "
              "in device memory");
}

// torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory (the default): new
// memory is filled with NaN, or the largest integer, as on the CPU and CUDA.
bool fill_uninitialized() {
  const at::Context& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() &&
         ctx.deterministicFillUninitializedMemory();
}

}  // namespace

// [doc:empty]
at::Tensor OpenRegNativeFunctions::empty(
    c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  check_factory_args(layout, pin_memory);
  const c10::OptionalDeviceGuard guard(device);
  at::Tensor t =
      at::detail::empty_generic(size, device_allocator(), kKeySet,
                                c10::dtype_or_default(dtype), memory_format);
  if (C10_UNLIKELY(fill_uninitialized())) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}
// [/doc:empty]

at::Tensor OpenRegNativeFunctions::empty_strided(
    c10::IntArrayRef size, c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
    std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  check_factory_args(layout, pin_memory);
  const c10::OptionalDeviceGuard guard(device);
  at::Tensor t = at::detail::empty_strided_generic(
      size, stride, device_allocator(), kKeySet, c10::dtype_or_default(dtype));
  if (C10_UNLIKELY(fill_uninitialized())) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}

const at::Tensor& OpenRegNativeFunctions::resize_(
    const at::Tensor& self, c10::IntArrayRef size,
    std::optional<c10::MemoryFormat> memory_format) {
  for (auto s : size) {
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s,
                ": ", size);
  }
  const int64_t old_nbytes =
      self.has_storage() ? static_cast<int64_t>(self.storage().nbytes()) : 0;
  resize_impl(self.unsafeGetTensorImpl(), size, std::nullopt);
  if (C10_UNLIKELY(fill_uninitialized())) {
    at::native::fill_resize_deterministic_(self, old_nbytes);
  }
  if (memory_format.has_value() &&
      *memory_format != c10::MemoryFormat::Preserve) {
    self.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& OpenRegNativeFunctions::set__symint(at::Tensor& self,
                                                c10::Storage source,
                                                c10::SymInt storage_offset,
                                                c10::SymIntArrayRef size,
                                                c10::SymIntArrayRef stride) {
  auto offset = storage_offset.expect_int();
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto strides = C10_AS_INTARRAYREF_SLOW(stride);
  at::native::checkSetStorage(self, std::move(source), offset, sizes, strides);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  std::optional<c10::IntArrayRef> stride_opt =
      strides.data() != nullptr ? std::optional<c10::IntArrayRef>(strides)
                                : std::nullopt;
  resize_impl(self.unsafeGetTensorImpl(), sizes, stride_opt);
  return self;
}

at::Tensor& OpenRegNativeFunctions::set_(at::Tensor& self,
                                         c10::Storage source) {
  const auto numel =
      static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  const std::vector<c10::SymInt> size{c10::SymInt(numel)};
  return set__symint(self, std::move(source), 0, size, {});
}

at::Tensor& OpenRegNativeFunctions::set_(at::Tensor& self,
                                         const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  return set__symint(self, source.storage(), source.sym_storage_offset(),
                     source.sym_sizes(), source.sym_strides());
}

at::Tensor& OpenRegNativeFunctions::set_(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(),
                       /*resizable=*/true);
  const std::vector<c10::SymInt> size{c10::SymInt(0)};
  return set__symint(self, std::move(storage), 0, size, {});
}

// [doc:local-scalar-dense]
at::Scalar OpenRegNativeFunctions::_local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  // A device-to-host copy: waits for the producing work, like CUDA's .item().
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  const c10::DeviceIndex device = self.device().index();
  warn_or_error_on_sync("aten::_local_scalar_dense, e.g. Tensor.item()");
  memcpy_blocking(host.data_ptr(), self.const_data_ptr(),
                  self.dtype().itemsize(), orMemcpyDeviceToHost,
                  getCurrentStream(device));
  host._set_conj(self.is_conj());
  host._set_neg(self.is_neg());
  return at::native::_local_scalar_dense_cpu(host.resolve_conj().resolve_neg());
}
// [/doc:local-scalar-dense]

// [doc:shallow-copy]
// Whether `from`'s data may replace `self`'s in place (`param.data = t`,
// and Module.to(), which keeps the same Parameter objects when this holds).
// PyTorch allows it between dense tensors of its built-in devices (CPU and
// CUDA alike) and leaves PrivateUse1 to the backend: dense strided tensors
// of the CPU and openreg are interchangeable the same way.
bool OpenRegNativeFunctions::_has_compatible_shallow_copy_type(
    const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(
          from.key_set())) {
    return true;
  }
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() &&
           (t.is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  return dense(self) && dense(from);
}
// [/doc:shallow-copy]

// Tensor.record_stream: the caching allocator keeps the block from other
// streams until `stream` has passed its use.
void OpenRegNativeFunctions::record_stream(at::Tensor& self,
                                           c10::Stream stream) {
  device_allocator()->recordStream(self.storage().data_ptr(), stream);
}

// Views share the storage: ATen's own kernels, the same for every device.
at::Tensor OpenRegNativeFunctions::as_strided(
    const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
    std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor OpenRegNativeFunctions::view(const at::Tensor& self,
                                        at::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor OpenRegNativeFunctions::_reshape_alias(const at::Tensor& self,
                                                  at::IntArrayRef size,
                                                  at::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// [doc:record-stream-math-bits]
// Tensor.record_stream on a conjugate or negative view (x.conj(),
// x.conj().imag) names the view's memory; its math bit does not matter, so
// the Conjugate and Negative keys pass it through. Without this, PyTorch's
// Conjugate/Negative fallback (ATen/native/MathBitsFallback.h) takes it: it
// clones the view, runs the operator on the clone and then, to copy the clone
// back, reads the operator's result from the stack, but record_stream returns
// nothing, so it reads past the end of the stack and releases the clone twice
// (heap corruption: "free(): corrupted unsorted chunks"; found by tests/fuzz).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("record_stream", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("record_stream", torch::CppFunction::makeFallthrough());
}
// [/doc:record-stream-math-bits]

}  // namespace openreg
